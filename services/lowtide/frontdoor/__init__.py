"""The front door: the Admin gRPC service, split by role into ``admin/`` (the Admin API),
``controller/``, ``groups/`` (the group coordinator) and ``transactions/`` (the transaction
coordinator). Here at the top: what serves every role — the process (``server.py``), the gRPC
servicer (``servicer.py``), partition routing for fan-outs (``routing.py``), cluster metrics
(``metrics.py``) and the orphan scanner proxy (``scanner_proxy.py``)."""
