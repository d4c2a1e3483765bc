"""Cohort's elastic distributed PyTorch trainer."""
