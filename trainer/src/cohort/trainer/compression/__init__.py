"""Communication compression (``spec.compression``): one class per method, error feedback, DDP hooks.

``METHODS`` (registry.py) maps every CRD enum string to its class, which says
everything about the method (base.py): the syncs it supports, its DDP hook
(``sync.algorithm: allreduce``), its gossip consensus step and its local-SGD
cast. Gossip (sync/gossip.py) uses the payload compressors on the parameter
differences it exchanges.
"""
