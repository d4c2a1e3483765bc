"""Communication compression (``spec.compression``): compressors, error feedback, DDP hooks.

``COMPRESSORS`` (registry.py) maps the CRD enum strings to compressor classes;
``hooks.make_ddp_hook`` turns the spec into a DDP communication hook for
``sync.algorithm: allreduce``; gossip (sync/gossip.py) uses the same
compressors on the parameters it exchanges.
"""
