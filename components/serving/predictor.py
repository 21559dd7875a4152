"""The model side of online inference: embed, classify and retrieve for existing and new nodes.

``Predictor.load`` opens a published model, its partitions and (optionally) an infer output
(local or ``gs://``, copied into the cache and checked against the manifests); the graph and
features stay memory-mapped (:mod:`.graph_store`). ``predict`` answers one micro-batch:

- an existing node (by original id): its stored row of an ``infer --mode exact`` output when one
  is given, else its embedding computed over its full neighbourhood (what exact mode computes);
- a new node: its raw columns through the fitted transforms (:mod:`.encode`; a featureless type
  starts from the cold-start row), its neighbourhood sampled from the stored graph with the
  training fan-outs, the request's edges being its first hop (:mod:`.neighbourhood`), and the
  encoder run on that subgraph (GCN, APPNP and GCNII, which read the whole subgraph, on each
  node's own, so that an answer does not depend on the requests batched with it);
- then the class and probabilities (node classification, target type) or the top-k candidates
  (link prediction, source type of the target edge, :mod:`.retrieval_index`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import numpy as np
import torch

from components.config import parse_config
from components.config.steps import PROPAGATION_TYPES
from components.errors import GnnflowError
from components.gnn.build import forward_edge_name, uses_edge_features
from components.infer.cold_start import trained_elsewhere
from components.infer.output import STEP as INFER_STEP
from components.infer.restore import model_config, restore_model
from components.infer.schema_fit import check_model_fits
from components.partition.output import STEP as PARTITION_STEP
from components.serving.encode import FeatureEncoder
from components.serving.graph_store import GraphStore
from components.serving.instances import ExistingNode, Instance, InstanceError, NewEdge, NewNode, Prediction, ServingSchema
from components.serving.learnt_rows import learnt_tables
from components.serving.local_files import LocalOutput, default_cache_dir
from components.serving.neighbourhood import GivenEdges, build_subgraph
from components.serving.retrieval_index import Retrieval, StoredEmbeddings
from components.serving.subgraph_encoder import encode_seeds, prepare, whole_subgraph
from components.train.output import STEP as TRAIN_STEP
from components.train.output import TRANSFORM_STATE_FILE

__all__ = ["ExistingNode", "Instance", "InstanceError", "NewEdge", "NewNode", "Prediction", "Predictor", "ServingSchema"]

log = logging.getLogger("gnnflow.serving")


def serving_threads() -> int:
    """Torch threads for one micro-batch: ``GNNFLOW_SERVING_THREADS``, else one (a batch's
    subgraph is small; one thread answers soonest and leaves the other core to the HTTP loop)."""
    return max(1, int(os.environ.get("GNNFLOW_SERVING_THREADS", "1")))


class Predictor:
    """See the module docstring; build one with :meth:`load`."""

    def __init__(self, **parts: object) -> None:
        self.__dict__.update(parts)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model: str, partitions: str, embeddings: str | None = None, cache_dir: str | None = None) -> Predictor:
        cache = cache_dir or default_cache_dir()
        store = GraphStore(LocalOutput.open(partitions, PARTITION_STEP, cache))
        schema = store.schema
        model_local = LocalOutput.open(model, TRAIN_STEP, cache)
        published = model_local.published
        check_model_fits(published, schema, store.local.published.root)
        config = parse_config(open(model_local.path("config.resolved.yaml")).read(), str(published.uri("config.resolved.yaml")))  # noqa: SIM115
        elsewhere = trained_elsewhere(published, store.local.published)
        restored = restore_model(published, schema, config, store.edge_dir, trained_elsewhere=elsewhere)
        config = model_config(config, restored.spec)
        if uses_edge_features(schema, config):
            raise GnnflowError(f"{published.root} reads edge features (model.type gat): serving does not supply them yet")
        prepare(restored.module.encoder)
        state = published.read_json(TRANSFORM_STATE_FILE) if TRANSFORM_STATE_FILE in published.manifest.files else None
        stored = None
        if embeddings is not None:
            stored = StoredEmbeddings(LocalOutput.open(embeddings, INFER_STEP, cache), store, restored.spec.hidden_channels)
        retrieval = None
        if schema.task_type == "link_prediction" and restored.spec.decoder == "dot" and stored is not None:
            edge = schema.edge_types[schema.target]
            retrieval = Retrieval(edge.dst_type, stored, store, edge.src_type == edge.dst_type)
        torch.set_num_threads(serving_threads())
        fan_outs = {r.stored: config.fan_outs_of(forward_edge_name(r.stored)) for r in store.relations}
        # appnp and gcnii propagate over a subgraph as deep as training sampled, not one hop per layer.
        hops = max(map(len, fan_outs.values())) if restored.spec.type in PROPAGATION_TYPES else restored.spec.num_layers
        predictor = cls(
            store=store,
            restored=restored,
            module=restored.module,
            layers=hops,
            fan_outs=fan_outs,
            salt=config.training.seed,
            features=FeatureEncoder(state, list(schema.node_types)) if state is not None else None,
            learnt=learnt_tables(model_local, restored, store, store.local.published, elsewhere),
            stored=stored if stored is not None and stored.mode == "exact" else None,
            retrieval=retrieval,
            schema_=_serving_schema(store, state),
        )
        log.info(
            "serving: %s on %s loaded (%s, %d hops, fan-outs %s); existing nodes: %s",
            published.root,
            store.local.published.root,
            schema.task_type,
            hops,
            fan_outs,
            "stored exact embeddings" if predictor.stored is not None else "computed over full neighbourhoods",
        )
        return predictor

    @property
    def schema(self) -> ServingSchema:
        return self.schema_  # type: ignore[attr-defined]

    def predict(self, instances: Sequence[Instance], k: int = 10) -> list[Prediction]:
        """One micro-batch, answered in order; an :class:`InstanceError` names the first bad instance."""
        with self._lock:
            return self._predict(list(instances), k)

    # The attributes below are set by load (see the keyword arguments there).
    store: GraphStore
    module: torch.nn.Module
    layers: int
    fan_outs: dict[str, list[int]]
    salt: int
    features: FeatureEncoder | None
    learnt: dict[str, tuple[np.ndarray, np.ndarray]]
    stored: StoredEmbeddings | None
    retrieval: Retrieval | None

    def _node_type(self, index: int, node_type: str) -> str:
        if node_type not in self.store.counts:
            raise InstanceError(index, "node_type", f"unknown node type {node_type!r} (known: {', '.join(self.store.counts)})")
        return node_type

    def _lookup(self, index: int, field: str, node_type: str, node_id: str) -> int:
        found = int(self.store.ids[node_type].lookup([str(node_id)])[0])
        if found < 0:
            raise InstanceError(index, field, f"unknown {node_type!r} node id {node_id!r}")
        return found

    def _edge_name(self, index: int, field: str, edge_type: str) -> str:
        edges = self.store.schema.message_edge_types
        if edge_type in edges:
            return edge_type
        named = [name for name, e in edges.items() if e.relation == edge_type]
        if len(named) == 1:
            return named[0]
        which = "is ambiguous" if named else "is not an edge type of the graph"
        raise InstanceError(index, field, f"{edge_type!r} {which} (known: {', '.join(edges)})")

    def _edge_ends(self, index: int, node: NewNode) -> list[tuple[str, str]]:
        """(stored edge type, neighbour's node type) of each of a new node's request edges, checked."""
        checked = []
        for j, edge in enumerate(node.edges):
            name = self._edge_name(index, f"edges[{j}].edge_type", edge.edge_type)
            schema_edge = self.store.schema.edge_types[name]
            if edge.direction not in ("out", "in"):
                raise InstanceError(index, f"edges[{j}].direction", f"expected 'out' or 'in', got {edge.direction!r}")
            ends = (schema_edge.src_type, schema_edge.dst_type)
            own, other = ends if edge.direction == "out" else ends[::-1]
            if own != node.node_type:
                end = "source" if edge.direction == "out" else "destination"
                raise InstanceError(
                    index, f"edges[{j}].edge_type", f"{name} has {own!r} nodes at its {end}, this new node is of type {node.node_type!r}"
                )
            checked.append((name, other))
        return checked

    def _neighbours(self, pending: list[tuple[int, NewNode, list[tuple[str, str]]]]) -> list[np.ndarray]:
        """Partition ids of each pending new node's request edges: one search per neighbour type
        for the whole micro-batch; an unknown id is the error of the first instance (and edge) with one."""
        keys = [(p, j, other) for p, (_, _, checked) in enumerate(pending) for j, (_, other) in enumerate(checked)]
        found = np.zeros(len(keys), dtype=np.int64)
        for other in {o for _, _, o in keys}:
            at = [n for n, key in enumerate(keys) if key[2] == other]
            found[at] = self.store.ids[other].lookup([str(pending[keys[n][0]][1].edges[keys[n][1]].node_id) for n in at])
        if (found < 0).any():
            p, j, other = keys[int(np.flatnonzero(found < 0)[0])]
            index, node, _ = pending[p]
            raise InstanceError(index, f"edges[{j}].node_id", f"unknown {other!r} node id {node.edges[j].node_id!r}")
        bounds = np.cumsum([0] + [len(checked) for _, _, checked in pending])
        return [found[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]

    def _given(self, node: NewNode, checked: list[tuple[str, str]], found: np.ndarray, seed: int) -> list[tuple[str, int, int]]:
        """(stored edge type, seed, neighbour id) of each request edge the new node aggregates along."""
        out = []
        new = -1 - seed
        for (name, _), edge, neighbour in zip(checked, node.edges, found.tolist()):
            schema_edge = self.store.schema.edge_types[name]
            # The stored forms of the edge (src, dst): as given, and reversed for an undirected type.
            forms = [(name, *((new, neighbour) if edge.direction == "out" else (neighbour, new)))]
            if schema_edge.undirected:
                reverse = name if schema_edge.src_type == schema_edge.dst_type else self._reverse_name(name)
                forms.append((reverse, forms[0][2], forms[0][1]))
            for stored, src, dst in forms:
                aggregating, neighbour_end = (src, dst) if self.store.edge_dir == "out" else (dst, src)
                if aggregating == new:
                    out.append((stored, seed, neighbour_end))
        return out

    @staticmethod
    def _reverse_name(name: str) -> str:
        src, relation, dst = name.split("__")
        return f"{dst}__rev_{relation}__{src}"

    def _inputs(self, new_rows: dict[str, np.ndarray]):  # noqa: ANN202 - an InputRows callable
        def rows(node_type: str, ids: np.ndarray) -> np.ndarray:
            existing = ids >= 0
            if node_type in self.learnt:
                table, cold = self.learnt[node_type]
                out = np.empty((len(ids), table.shape[1]), dtype=np.float32)
                out[existing] = table[ids[existing]]
                out[~existing] = cold
                return out
            if existing.all():
                return self.store.gather_features(node_type, ids)
            out = np.empty((len(ids), self.store.schema.node_types[node_type].feature_dim), dtype=np.float32)
            out[existing] = self.store.gather_features(node_type, ids[existing])
            out[~existing] = new_rows[node_type][-1 - ids[~existing]]
            return out

        return rows

    def _predict(self, instances: list[Instance], k: int) -> list[Prediction]:
        existing: dict[str, list[tuple[int, int]]] = {}  # type → (instance, id)
        new: dict[str, list[tuple[int, dict]]] = {}  # type → (instance, checked features)
        pending: list[tuple[int, NewNode, list[tuple[str, str]]]] = []  # (instance, node, its checked edge ends)
        failure: InstanceError | None = None
        for i, instance in enumerate(instances):
            try:
                node_type = self._node_type(i, instance.node_type)
                if isinstance(instance, ExistingNode):
                    existing.setdefault(node_type, []).append((i, self._lookup(i, "node_id", node_type, instance.node_id)))
                    continue
                values: dict = {}
                if node_type not in self.learnt:
                    if self.features is None:
                        raise InstanceError(i, "features", "the model carries no transform_state.json: it cannot encode new nodes")
                    values = self.features.check(node_type, instance.features, i)
                elif instance.features:
                    raise InstanceError(i, f"features.{next(iter(instance.features))}", f"node type {node_type!r} has no feature columns")
                pending.append((i, instance, self._edge_ends(i, instance)))
                new.setdefault(node_type, []).append((i, values))
            except InstanceError as exc:
                failure = exc  # the first bad instance, unless an earlier one names an unknown neighbour
                break
        found = self._neighbours(pending)
        if failure is not None:
            raise failure
        given: list[tuple[str, int, int]] = []  # (stored edge type, seed, neighbour)
        seeds: dict[str, int] = {}
        for (_, node, checked), ids in zip(pending, found):
            seeds[node.node_type] = seed = seeds.get(node.node_type, -1) + 1
            given += self._given(node, checked, ids, seed)
        z: dict[int, torch.Tensor] = {}
        z.update(self._existing(existing))
        z.update(self._new(new, given))
        return self._answers(instances, z, k)

    def _existing(self, existing: dict[str, list[tuple[int, int]]]) -> dict[int, torch.Tensor]:
        if not existing:
            return {}
        if self.stored is not None:
            return {i: torch.from_numpy(np.array(self.stored.rows[t][node])) for t, pairs in existing.items() for i, node in pairs}
        if whole_subgraph(self.module.encoder):  # each node alone: its answer must not depend on its batch
            return {i: self._encode({t: np.array([node])}, [], {}, None)[t][0] for t, pairs in existing.items() for i, node in pairs}
        seeds = {t: np.unique([node for _, node in pairs]) for t, pairs in existing.items()}
        out = self._encode(seeds, [], {}, None)
        return {i: out[t][int(np.searchsorted(seeds[t], node))] for t, pairs in existing.items() for i, node in pairs}

    def _encode(
        self, seeds: dict[str, np.ndarray], edges: list[GivenEdges], rows: dict[str, np.ndarray], fan_outs: dict[str, list[int]] | None
    ) -> dict[str, torch.Tensor]:
        """Node type → (seeds, hidden): the encoder on the subgraph of ``seeds`` (type → ids, new ones
        negative), sampled with ``fan_outs`` (None: every neighbour)."""
        sub = build_subgraph(self.store, seeds, edges, self.layers, fan_outs, self.salt)
        return encode_seeds(self.module.encoder, sub, self._inputs(rows), self.layers)

    def _new(self, new: dict[str, list[tuple[int, dict]]], given: list[tuple[str, int, int]]) -> dict[int, torch.Tensor]:
        if not new:
            return {}
        encoder = self.features
        rows = (
            {
                t: self.store.as_stored(t, encoder.encode(t, [v for _, v in items], [i for i, _ in items]))
                for t, items in new.items()
                if t not in self.learnt
            }
            if encoder
            else {}
        )
        relations = {r.stored: r for r in self.store.relations}
        grouped: dict[str, list[tuple[int, int]]] = {}
        for stored, seed, neighbour in given:
            grouped.setdefault(stored, []).append((seed, neighbour))
        edges = [
            GivenEdges(relations[s], np.array([p[0] for p in v]), np.array([p[1] for p in v], dtype=np.int64)) for s, v in grouped.items()
        ]
        if whole_subgraph(self.module.encoder):  # each new node alone, with its own request edges
            return {i: self._alone(t, j, edges, rows) for t, items in new.items() for j, (i, _) in enumerate(items)}
        seeds = {t: -1 - np.arange(len(items), dtype=np.int64) for t, items in new.items()}
        out = self._encode(seeds, edges, rows, self.fan_outs)
        return {i: out[t][j] for t, items in new.items() for j, (i, _) in enumerate(items)}

    def _alone(self, node_type: str, j: int, edges: list[GivenEdges], rows: dict[str, np.ndarray]) -> torch.Tensor:
        """The ``j``-th new node of ``node_type`` encoded on its own subgraph: its request edges and its row only."""
        own = [
            GivenEdges(g.relation, np.zeros(int(mine.sum()), dtype=np.int64), g.neighbours[mine])
            for g in edges
            if g.relation.aggregating == node_type and (mine := g.seeds == j).any()
        ]
        row = {node_type: rows[node_type][j : j + 1]} if node_type in rows else {}
        return self._encode({node_type: np.array([-1])}, own, row, self.fan_outs)[node_type][0]

    @torch.inference_mode()
    def _answers(self, instances: list[Instance], z: dict[int, torch.Tensor], k: int) -> list[Prediction]:
        schema = self.store.schema
        matrix = torch.stack([z[i] for i in range(len(instances))]) if instances else torch.zeros((0, 0))
        link = schema.task_type == "link_prediction"
        embedded = self.module.embed(matrix) if link else matrix
        out = [Prediction(embedding=row) for row in embedded.tolist()]
        if not link:
            vocabulary = schema.node_types[schema.target].label_vocabulary or []
            chosen = [i for i, inst in enumerate(instances) if inst.node_type == schema.target]
            if chosen:
                probabilities = torch.softmax(self.module.classify(matrix[chosen]), dim=-1).tolist()
                for i, p in zip(chosen, probabilities):
                    best = int(np.argmax(p))
                    out[i] = Prediction(out[i].embedding, vocabulary[best], dict(zip(vocabulary, p)))
            return out
        edge = schema.edge_types[schema.target]
        chosen = [i for i, inst in enumerate(instances) if inst.node_type == edge.src_type]
        if self.retrieval is not None and chosen:
            exclude = [inst.node_id if isinstance(inst, ExistingNode) else None for inst in (instances[i] for i in chosen)]
            found = self.retrieval.search(embedded[chosen].numpy(), k, exclude)
            for i, candidates in zip(chosen, found):
                out[i] = Prediction(out[i].embedding, candidates=candidates)
        return out


def _serving_schema(store: GraphStore, state: dict | None) -> ServingSchema:
    schema = store.schema
    edges = schema.message_edge_types
    relations = [e.relation for e in edges.values()]
    accepted = list(edges) + [r for r in dict.fromkeys(relations) if relations.count(r) == 1 and r not in edges]
    columns = FeatureEncoder(state, list(schema.node_types)).columns if state is not None else {t: {} for t in schema.node_types}
    return ServingSchema(
        node_types=tuple(schema.node_types),
        edge_types=tuple(accepted),
        default_node_type=next(iter(schema.node_types)) if len(schema.node_types) == 1 else None,
        default_edge_type=next(iter(edges)) if len(edges) == 1 else None,
        feature_columns=columns,
        task_type=schema.task_type,
        target=schema.target,
    )
