"""`real-data validate` (``runner``: its config and run): check a records file against the record schema of
``data_prep.records``."""
