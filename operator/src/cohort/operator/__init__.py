"""Cohort's Kubernetes operator: reconciles TrainingJobs into elastic worker pods."""
