"""Started with every Python process whose path holds this directory (the multi-process
DirectRunner's SDK workers among them): sets ingest's vocabulary limit from
INGEST_TEST_VOCABULARY_LIMIT, so a test reaches past the limit with a hundred values."""

import os

if os.environ.get("INGEST_TEST_VOCABULARY_LIMIT"):
    from ingest import contract

    contract.VOCABULARY_LIMIT = int(os.environ["INGEST_TEST_VOCABULARY_LIMIT"])
