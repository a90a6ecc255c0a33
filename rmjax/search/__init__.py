"""Searching for optimal and pessimal responses: the one-token sweep, beam search and GCG."""
