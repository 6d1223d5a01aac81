"""`fae view`: a static, self-contained per-claim ablation explorer (docs/view.md).

``data`` computes the index and detail shards from finished runs, ``site``
writes the files, ``assets/`` holds the page's JavaScript and CSS,
``browser`` drives headless Chromium for the tests and the benchmark.
"""
