"""An example of a user's own package for Cohort: a dataset read from files and two models.

Nothing here is part of Cohort; it imports only torch (and, for hf_gpt2,
Hugging Face transformers). docs/workloads.md walks through it.
"""
