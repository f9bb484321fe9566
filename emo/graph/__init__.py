"""Execution graph, what-if analysis and slack (docs/design.md §5 and emo.graph.whatif)."""

from __future__ import annotations

from emo.graph.build import build_graph
from emo.graph.graph import EDGE_KINDS, GPU_NODE_KINDS, NODE_KINDS, Graph
from emo.graph.summary import summary

__all__ = ["build_graph", "summary", "Graph", "NODE_KINDS", "EDGE_KINDS", "GPU_NODE_KINDS"]
