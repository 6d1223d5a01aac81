"""The evaluation-choice study (SPEC §10): does an evidence gain survive the choices every evaluator makes?

The library layer the ``fae study`` command is built on: the answer interfaces (``codes``, ``labels``),
the prompt that puts the evidence before the format instruction, the evidence submitted for scoring
(:mod:`fae.study.interfaces`), and the greedy plus seeded replicates whose samples depend on the unit and
the replicate only (:mod:`fae.study.replicates`; the sampling itself is the backends'
``generate_rows``). docs/study.md describes them.
"""
