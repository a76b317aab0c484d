"""What a cluster graph holds, for people: GPUs, NVLink domains, links, bisection bandwidth,
and a drawing."""

from __future__ import annotations

from collections import Counter

import networkx as nx

from simulator.topology.graph import gpus, nvlink_domains

GB = 1e9


def bisection_bandwidth(g: nx.DiGraph) -> float:
    """Bytes/s that can flow from the first half of the GPUs (by index) to the second half:
    the maximum flow over the links' per-direction bandwidths."""
    names = gpus(g)
    if len(names) < 2:
        return 0.0
    half = len(names) // 2
    flow = nx.DiGraph()
    for a, b, bw in g.edges(data="bandwidth_Bps"):
        flow.add_edge(a, b, capacity=bw)
    for v in names[:half]:
        flow.add_edge("_source", v)  # no capacity attribute: unbounded
    for v in names[half:]:
        flow.add_edge(v, "_sink")
    return float(nx.maximum_flow_value(flow, "_source", "_sink"))


def summary(g: nx.DiGraph) -> dict:
    """Counts and capacities of the graph (links counted once per physical link)."""
    links = Counter()
    for a, b, d in g.edges(data=True):
        if a < b:
            links[(d["kind"], d["bandwidth_Bps"])] += 1
    domains = Counter(len(d) for d in nvlink_domains(g))
    kinds = Counter(d.get("kind") for _, d in g.nodes(data=True))
    return {"name": g.graph.get("name", ""), "fabric": g.graph.get("fabric", ""),
            "gpus": len(gpus(g)), "switches": kinds.get("switch", 0),
            "nvlink_domains": dict(domains), "links": dict(links),
            "scale_up": "PCIe" if kinds.get("pcie_switch") else "NVLink",
            "bisection_Bps": bisection_bandwidth(g)}


def format_summary(info: dict) -> str:
    lines = [f"{info['name']} ({info['fabric']} fabric): {info['gpus']} GPUs, "
             f"{info['switches']} fabric switch{'es' if info['switches'] != 1 else ''}"]
    doms = ", ".join(f"{n} x {size} GPUs" for size, n in sorted(info["nvlink_domains"].items()))
    lines.append(f"  {info.get('scale_up', 'NVLink') + ' domains':<16} {doms}")
    for (kind, bw), n in sorted(info["links"].items()):
        lines.append(f"  {kind:<8} links  {n:>6} x {bw / GB:,.0f} GB/s per direction")
    lines.append(f"  bisection        {info['bisection_Bps'] / GB:,.0f} GB/s (first half of the "
                 f"GPUs to the second, per direction)")
    return "\n".join(lines)


def draw(g: nx.DiGraph, path: str) -> None:
    """A layered drawing: fabric switches on top, then NICs, GPUs, NVSwitches and hosts."""
    import matplotlib  # noqa: PLC0415 - only for this command

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    layer = {"switch": 0, "nic": 1, "gpu": 2, "nvswitch": 3, "pcie_switch": 3, "host": 4}
    u = nx.Graph(g)
    for _, d in u.nodes(data=True):
        d["layer"] = layer.get(d.get("kind"), 5) if d.get("tier") != "spine" else -1
    pos = {v: (x, -y) for v, (x, y) in  # switches on top
           nx.multipartite_layout(u, subset_key="layer", align="horizontal").items()}
    colors = {"nvlink": "tab:green", "pcie": "tab:gray", "network": "tab:blue"}
    fig, ax = plt.subplots(figsize=(max(8, len(gpus(g)) * 0.35), 6))
    nx.draw_networkx_edges(u, pos, ax=ax, width=0.6, alpha=0.6,
                           edge_color=[colors.get(d["kind"], "k") for *_, d in
                                       u.edges(data=True)])
    nx.draw_networkx_nodes(u, pos, ax=ax, node_size=60,
                           node_color=[layer.get(d.get("kind"), 5) for _, d in
                                       u.nodes(data=True)], cmap="tab10")
    if len(u) <= 80:
        nx.draw_networkx_labels(u, pos, ax=ax, font_size=6)
    ax.set_title(f"{g.graph.get('name', '')}: green NVLink, gray PCIe, blue network")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
