"""Quota arithmetic: quantities, the ClusterQueue/Cohort resource tree, usage, fair share.

Pure and synchronous; imports nothing outside the standard library.
"""
