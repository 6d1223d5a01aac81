"""The built-in demo (`real-demo`)."""
