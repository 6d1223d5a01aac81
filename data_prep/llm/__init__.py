"""The shared LLM layer of ``real-data enhance`` and ``real-data counterfactual``: annotator LLMs behind
OpenAI-compatible endpoints, asked through one client and one cache.

Modules: ``config`` (the annotator YAML: endpoints, models, decoding, retries; keys by variable name),
``client`` (async requests with bounded concurrency, retries and backoff; the task's own answer check
decides what is malformed), ``cache`` (the SQLite answer cache for resume), ``requests`` (everything
around a request: locks, the cache in front of the requests under way, de-duplication, usage,
interrupts, the atomic summary). Imports neither of its users: each task's prompts and parsers stay
in its own package.
"""
