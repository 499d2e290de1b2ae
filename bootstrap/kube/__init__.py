"""The bootstrap's view of the cluster's own objects: the in-cluster API client (``api``), the
documents it lists (``objects``), the facts read from Pods and Nodes (``facts``, ``podpage``,
``podtypes``), a job's pods as the servers to order, as its kind marks them (``jobpods``), and
the switch topology from Volcano HyperNodes or node labels (``hypernode``, ``hypernodetree``,
``labels``, ``topology``)."""
