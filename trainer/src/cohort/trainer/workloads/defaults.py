"""The built-in models' and datasets' default arguments, importable without torch.

The models and datasets take their defaults from here, and ``cohort plan``
(``profiling.profile_spec``) reads them to count the built-in transformer
without building it.
"""

TRANSFORMER = {"dim": 64, "n_layers": 2, "n_heads": 4, "ffn_mult": 4}
SYNTHETIC_LM = {"sequences": 2048, "seq_len": 32, "vocab": 64, "branching": 4, "seed": 0, "test_fraction": 0.1}
