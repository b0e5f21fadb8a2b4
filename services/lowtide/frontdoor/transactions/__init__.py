"""The transaction coordinator role: Kafka's transactions and producer ids at the front door. It
owns InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and the transaction descriptions
(``transactions.py``), transaction states in ``__transaction_state`` (``txn_log.py``, records in
Kafka's format: ``txn_records.py``) and producer ids in blocks claimed in the metadata store
(``producer_ids.py``, which ``lowtide metadata migrate`` also uses). From the other roles it
takes only ``admin``'s ``TopicAdmin``, to create its topic."""
