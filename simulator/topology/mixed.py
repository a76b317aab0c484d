"""The leaf-spine fabric over nodes of several presets, by its earlier address.

:func:`simulator.topology.graph.leaf_spine_graph` builds every leaf-spine graph, over one
preset's nodes (:func:`~simulator.topology.graph.build_graph`) or several (``[[pools]]``
on dgx-h100 and hgx-h200 nodes with ``[cluster] fabric = "leaf_spine"``, or a plan's
cross-kind pools); its Notes say how the rails are matched and the uplinks sized.
"""

from __future__ import annotations

from simulator.topology.graph import graph_name, leaf_spine_graph

__all__ = ["graph_name", "leaf_spine_graph"]
