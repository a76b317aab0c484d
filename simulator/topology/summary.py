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
            "scale_up": ("PCIe" if kinds.get("pcie_switch") else
                         "xGMI" if any(k == "xgmi" for k, _ in links) else "NVLink"),
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


def _order(name: str) -> tuple[str, int]:
    """``gpu12`` sorts as ("gpu", 12): GPUs, NICs and switches in numeric order."""
    stem = name.rstrip("0123456789")
    return stem, int(name[len(stem):] or 0)


def layout(g: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Positions by node: each node a column block (GPUs left to right in index order, its
    NICs above them, NVSwitch / PCIe switch and host below), fabric switches in rows above
    all nodes (spines on top), spread evenly."""
    rows = {"nic": 1.0, "gpu": 0.0, "nvswitch": -1.0, "pcie_switch": -1.0, "host": -2.0}
    per_node: dict[int, dict[str, list[str]]] = {}
    fabric: dict[str, list[str]] = {"spine": [], "leaf": []}
    for v, d in g.nodes(data=True):
        if "node" in d:
            per_node.setdefault(d["node"], {}).setdefault(d.get("kind"), []).append(v)
        else:
            fabric["spine" if d.get("tier") == "spine" else "leaf"].append(v)
    width = max((len(k.get("gpu", [])) for k in per_node.values()), default=1) + 1
    pos = {}
    for n, kinds in per_node.items():
        for kind, names in kinds.items():
            names = sorted(names, key=lambda v: g.nodes[v].get("index", _order(v)[1]))
            span = len(kinds.get("gpu", names)) - 1
            for i, v in enumerate(names):
                x = span / 2 if len(names) == 1 else i * span / max(len(names) - 1, 1)
                pos[v] = (n * width + x, rows.get(kind, -3.0))
    total = max(len(per_node) * width - 1, 1)
    for level, names in enumerate((fabric["leaf"], fabric["spine"])):
        names = sorted(names, key=_order)
        for i, v in enumerate(names):
            pos[v] = ((i + 0.5) * total / len(names), 2.5 + 1.5 * level)
    return pos


def draw(g: nx.DiGraph, path: str) -> None:
    """The cluster laid out by node (:func:`layout`): GPUs in index order, NVLink edges
    green, PCIe gray, NIC-to-fabric links blue and dashed, NICs drawn as squares."""
    from matplotlib.figure import Figure  # noqa: PLC0415 - only for this command
    from matplotlib.lines import Line2D  # noqa: PLC0415

    u = nx.Graph(g)
    pos = layout(g)
    colors = {"nvlink": "tab:green", "xgmi": "tab:red", "pcie": "tab:gray",
              "network": "tab:blue"}
    nodes = len({d["node"] for _, d in g.nodes(data=True) if "node" in d})
    fig = Figure(figsize=(max(8.0, len(gpus(g)) * 0.45 + nodes), 6))
    ax = fig.add_subplot()
    for kind, style in (("nvlink", "solid"), ("xgmi", "solid"), ("pcie", "solid"),
                        ("network", "dashed")):
        edges = [(a, b) for a, b, d in u.edges(data=True) if d["kind"] == kind]
        # A mesh's links join GPUs of one row: drawn as arcs, or they would overlap.
        arcs = {"arrows": True, "arrowstyle": "-", "connectionstyle": "arc3,rad=0.35"}
        nx.draw_networkx_edges(u, pos, edgelist=edges, ax=ax, width=0.6, alpha=0.6,
                               edge_color=colors[kind], style=style,
                               **(arcs if kind == "xgmi" and edges else {}))
    marks = {"gpu": ("o", "tab:green"), "nic": ("s", "tab:blue"),
             "nvswitch": ("D", "tab:olive"), "pcie_switch": ("D", "tab:gray"),
             "host": ("^", "tab:brown"), "switch": ("h", "tab:purple")}
    for kind, (shape, color) in marks.items():
        members = [v for v, d in u.nodes(data=True) if d.get("kind") == kind]
        nx.draw_networkx_nodes(u, pos, nodelist=members, ax=ax, node_size=70,
                               node_shape=shape, node_color=color)
    if len(u) <= 80:
        nx.draw_networkx_labels(u, pos, ax=ax, font_size=5,
                                labels={v: v for v in u if g.nodes[v].get("kind") == "gpu"})
    mesh = [Line2D([], [], color=colors["xgmi"], label="xGMI")
            if any(k == "xgmi" for _, _, k in u.edges(data="kind")) else None]
    legend = [Line2D([], [], color=colors["nvlink"], label="NVLink"), *filter(None, mesh),
              Line2D([], [], color=colors["pcie"], label="PCIe"),
              Line2D([], [], color=colors["network"], linestyle="--", label="network"),
              *[Line2D([], [], marker=m, color=c, linestyle="", label=k.replace("_", " "))
                for k, (m, c) in marks.items()]]
    ax.legend(handles=legend, fontsize=7, loc="lower right", ncols=3)
    ax.set_title(f"{g.graph.get('name', '')}: {nodes} node{'s' if nodes != 1 else ''}, "
                 f"GPUs in index order")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)  # a bare Figure: no backend, no window
