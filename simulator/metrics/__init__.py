"""Records from the run, and summaries computed from them."""
