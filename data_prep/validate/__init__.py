"""`real-data validate` (``cli``): check a records file against the record schema of ``data_prep.records``."""
