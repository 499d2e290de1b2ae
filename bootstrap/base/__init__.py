"""The bootstrap's floor: what every other module of it stands on, importing nothing of it above.

The domain's records (``model``, built fast from validated columns by ``columns``), the checks a
reader makes on a decoded document's fields (``fields``), finding and decoding the document in an
input (``payload``: base64, gzip, JSON or YAML; ``jsondecode``: the JSON codecs, msgspec loaded by
``accelerator`` only for big inputs), and a socket's time bound (``deadline``). The readers
(``ranktable``, ``topology``), the cluster's objects (``kube``) and the run sit on these; a test
keeps this package from importing any of them, so no cycle can run through the floor.
"""
