"""Request bodies → instances (components/serving/requests.py) against a schema, without a model:
the checks that need only the schema, on a heterogeneous graph where types cannot be left out."""

from __future__ import annotations

import json

import pytest

from components.serving.predictor import ExistingNode, NewEdge, NewNode, ServingSchema
from components.serving.requests import RequestError, parse_request

HETERO = ServingSchema(
    node_types=("paper", "author"),
    edge_types=("author__writes__paper", "writes", "paper__cites__paper", "cites"),
    default_node_type=None,
    default_edge_type=None,
    feature_columns={"paper": {"year": "number", "venue": "category"}, "author": {}},
    task_type="link_prediction",
    target="author__writes__paper",
)


def _parse(body: object, max_instances: int = 64):
    return parse_request(json.dumps(body).encode(), HETERO, max_instances)


def _error(body: object, **kwargs: int) -> RequestError:
    with pytest.raises(RequestError) as caught:
        _parse(body, **kwargs)
    return caught.value


def test_existing_and_new_nodes_become_typed_instances_in_order_with_k() -> None:
    parsed = _parse(
        {
            "instances": [
                {"node_type": "author", "node_id": 17},
                {
                    "node_type": "paper",
                    "features": {"year": 2021, "venue": 3},
                    "edges": [
                        {"edge_type": "cites", "node_id": "p1", "direction": "out"},
                        {"edge_type": "writes", "node_id": "a9", "direction": "in"},
                    ],
                },
                {"node_type": "author", "features": {}, "edges": []},
            ],
            "parameters": {"k": 25},
        }
    )
    assert parsed.k == 25
    assert parsed.instances == (
        ExistingNode("author", "17"),  # integer ids are compared as text, as the id map holds them
        NewNode("paper", {"year": 2021, "venue": 3}, (NewEdge("cites", "p1", "out"), NewEdge("writes", "a9", "in"))),
        NewNode("author", {}, ()),
    )
    assert _parse({"instances": [{"node_type": "author", "node_id": "a"}]}).k == 10


def test_a_null_or_missing_feature_is_left_to_the_model_which_knows_whether_it_fills() -> None:
    parsed = _parse({"instances": [{"node_type": "paper", "features": {"year": None}, "edges": []}]})
    assert parsed.instances[0] == NewNode("paper", {"year": None}, ())


@pytest.mark.parametrize(
    ("body", "instance", "field", "words"),
    [
        ({"instances": [{"node_id": "a"}]}, 0, "node_type", "missing field: the graph has several (paper, author)"),
        ({"instances": [{"node_type": "venue", "node_id": "a"}]}, 0, "node_type", "unknown node type 'venue'"),
        ({"instances": [{"node_type": "paper", "node_id": True}]}, 0, "node_id", "got true"),
        ({"instances": [{"node_type": "paper", "node_id": "a", "features": {}}]}, 0, "node_id", "an existing node has node_id only"),
        ({"instances": [{"node_type": "paper", "features": {"year": "1999"}}]}, 0, "features.year", 'expected a number, got "1999"'),
        ({"instances": [{"node_type": "paper", "features": {"venue": 1.5}}]}, 0, "features.venue", "expected a category"),
        ({"instances": [{"node_type": "author", "features": {"age": 3}}]}, 0, "features.age", "(it reads: none)"),
        ({"instances": [{"node_type": "paper", "features": {}, "edges": {}}]}, 0, "edges", "expected a list of edges"),
        ({"instances": [{"node_type": "paper", "edges": [{"node_id": "p", "direction": "out"}]}]}, 0, "edges[0].edge_type", "missing"),
        ({"instances": [{"node_type": "paper", "edges": [{"edge_type": "cites", "direction": "out"}]}]}, 0, "edges[0].node_id", "missing"),
        ({"instances": [{"node_type": "paper", "edges": [{"edge_type": "cites", "node_id": "p"}]}]}, 0, "edges[0].direction", "missing"),
        (
            {"instances": [{"node_type": "paper", "edges": [{"edge_type": "cites", "node_id": "p", "direction": "out", "w": 1}]}]},
            0,
            "edges[0].w",
            "unknown field",
        ),  # fmt: skip
        ({"instances": [{"node_type": "author", "node_id": "a"}, "a"]}, 1, None, "expected an object, got a string"),
        ({"instances": []}, None, "instances", "no instances"),
        ({"instances": {}}, None, "instances", "expected a list"),
        ({"instances": [{"node_type": "author", "node_id": "a"}], "parameters": {"top": 3}}, None, "parameters.top", "unknown parameter"),
        ({"instances": [{"node_type": "author", "node_id": "a"}], "parameters": {"k": 1001}}, None, "parameters.k", "from 1 to 1000"),
        ({"instances": [{"node_type": "author", "node_id": "a"}], "parameters": {"k": 2.0}}, None, "parameters.k", "got 2.0"),
        ({"instance": [{"node_type": "author", "node_id": "a"}]}, None, "instance", "unknown field"),
    ],
)
def test_each_bad_request_names_its_instance_and_field(body: object, instance: int | None, field: str | None, words: str) -> None:
    error = _error(body)
    assert (error.instance, error.field, error.status) == (instance, field, 400)
    assert words in error.message
    assert error.body() == {"error": {"message": str(error), "instance": instance, "field": field}}


def test_the_instance_limit_is_the_servers_setting() -> None:
    body = {"instances": [{"node_type": "author", "node_id": str(i)} for i in range(5)]}
    assert len(_parse(body, max_instances=5).instances) == 5
    assert "5 instances, more than the limit of 4 per request" in _error(body, max_instances=4).message


def test_bodies_that_are_not_json_objects_are_refused_whole() -> None:
    for body in (b"", b"\xff\xfe", b"{", b'{"instances": [Infinity]}', b"[]", b"3"):
        with pytest.raises(RequestError) as caught:
            parse_request(body, HETERO)
        assert (caught.value.instance, caught.value.field) == (None, None)
