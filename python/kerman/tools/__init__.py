"""Tools: what a tool is, what it gets and returns, its schema inferred from a signature, and the
executor of several calls."""
