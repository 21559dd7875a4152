"""A local HTTP endpoint that records every request and answers with canned JSON.

Submission and scheduling tests point the real ``google-cloud-aiplatform`` (REST transport)
and ``kfp`` clients at it, then assert on what the clients sent: nothing leaves the machine.

``RecordingServer`` is the generic part (routes, recording, multipart parsing);
``add_vertex_routes`` and ``add_kfp_routes`` install stateful fakes of the few API resources
gnnflow uses (pipeline jobs and schedules on Vertex AI; experiments, runs, pipelines and
recurring runs on KFP), so that a create followed by a get or a pause behaves plausibly.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    body: bytes

    @property
    def json(self) -> Any:
        """The body parsed as JSON (None when empty)."""
        return json.loads(self.body) if self.body else None

    @property
    def form(self) -> dict[str, bytes]:
        """The parts of a ``multipart/form-data`` body by field name."""
        content_type = self.headers.get("content-type", "")
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + self.body
        )
        return {part.get_param("name", header="content-disposition"): part.get_payload(decode=True) for part in message.iter_parts()}


Reply = tuple[int, Any]
Responder = Callable[[RecordedRequest, "re.Match[str]"], Reply]


@dataclass
class _Route:
    method: str
    pattern: re.Pattern[str]
    respond: Responder


@dataclass
class RecordingServer:
    """A threaded HTTP server on a free 127.0.0.1 port.

    Later routes take precedence over earlier ones; a request no route matches is recorded
    and answered 404, so an unexpected call shows up in ``requests`` and fails the client.
    """

    requests: list[RecordedRequest] = field(default_factory=list)
    _routes: list[_Route] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def route(self, method: str, pattern: str, reply: Reply | Responder) -> None:
        """Answer ``method`` on paths fully matching ``pattern`` with a fixed reply or a responder."""
        respond = reply if callable(reply) else (lambda _request, _match, fixed=reply: fixed)
        self._routes.insert(0, _Route(method.upper(), re.compile(pattern), respond))

    @property
    def url(self) -> str:
        assert self._server is not None, "the recording server is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="recording-server", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> RecordingServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def seen(self, method: str | None = None, path: str | None = None) -> list[RecordedRequest]:
        """Recorded requests, optionally only one method and paths fully matching a regex."""
        with self._lock:
            found = list(self.requests)
        return [r for r in found if (method is None or r.method == method.upper()) and (path is None or re.fullmatch(path, r.path))]

    def _dispatch(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            routes = list(self._routes)
        for route in routes:
            match = route.pattern.fullmatch(request.path)
            if route.method == request.method and match:
                return route.respond(request, match)
        return 404, {"error": {"code": 404, "message": f"no route for {request.method} {request.path}", "status": "NOT_FOUND"}}


def _handler_for(server: RecordingServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self) -> None:
            split = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            request = RecordedRequest(
                method=self.command,
                path=split.path,
                query=parse_qs(split.query, keep_blank_values=True),
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
            status, payload = server._dispatch(request)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

    return Handler


def _states(sequence: Iterable[str]) -> Iterator[str]:
    """Each poll gets the next state; the last one repeats."""
    items = list(sequence)
    return itertools.chain(items, itertools.repeat(items[-1]))


# ------------------------------------------------------------------------------ Vertex AI
_LOCATION = r"/v1/(?P<parent>projects/[^/]+/locations/[^/]+)"


def add_vertex_routes(server: RecordingServer, job_states: Iterable[str] = ("PIPELINE_STATE_SUCCEEDED",)) -> None:
    """Pipeline jobs and schedules of the Vertex AI REST API (v1).

    A created job answers ``PIPELINE_STATE_PENDING``; each later GET of it answers the next of
    ``job_states``. Schedules keep their state across pause and resume; delete returns a done
    operation.
    """
    jobs: dict[str, dict[str, Any]] = {}
    schedules: dict[str, dict[str, Any]] = {}
    states = _states(job_states)
    schedule_ids = itertools.count(1)

    def create_job(request: RecordedRequest, match: re.Match[str]) -> Reply:
        job_id = request.query.get("pipelineJobId", ["generated-1"])[0]
        name = f"{match['parent']}/pipelineJobs/{job_id}"
        if name in jobs:
            return 409, {"error": {"code": 409, "message": f"{name} already exists", "status": "ALREADY_EXISTS"}}
        jobs[name] = {**request.json, "name": name, "state": "PIPELINE_STATE_PENDING"}
        return 200, jobs[name]

    def get_job(request: RecordedRequest, match: re.Match[str]) -> Reply:
        name = match["name"]
        if name not in jobs:
            return 404, {"error": {"code": 404, "message": f"{name} not found", "status": "NOT_FOUND"}}
        job = jobs[name] = {**jobs[name], "state": next(states)}
        # Vertex AI makes the run's metadata context soon after the job (what an experiment links to).
        context = f"{match['name'].split('/pipelineJobs/')[0]}/metadataStores/default/contexts/{name.rsplit('/', 1)[-1]}"
        job["jobDetail"] = {
            "pipelineRunContext": {"name": context, "displayName": name.rsplit("/", 1)[-1], "schemaTitle": "system.PipelineRun"}
        }
        if job["state"] == "PIPELINE_STATE_FAILED":
            job["error"] = {"code": 9, "message": "The DAG failed because some tasks failed: train."}
        return 200, job

    def create_schedule(request: RecordedRequest, match: re.Match[str]) -> Reply:
        name = f"{match['parent']}/schedules/{next(schedule_ids)}"
        schedules[name] = {**request.json, "name": name, "state": "ACTIVE"}
        return 200, schedules[name]

    def list_schedules(request: RecordedRequest, match: re.Match[str]) -> Reply:
        return 200, {"schedules": [s for n, s in schedules.items() if n.startswith(match["parent"] + "/")]}

    def one_schedule(change: Callable[[str], Reply]) -> Responder:
        def respond(request: RecordedRequest, match: re.Match[str]) -> Reply:
            if match["name"] not in schedules:
                return 404, {"error": {"code": 404, "message": f"{match['name']} not found", "status": "NOT_FOUND"}}
            return change(match["name"])

        return respond

    def set_state(state: str) -> Callable[[str], Reply]:
        def change(name: str) -> Reply:
            schedules[name]["state"] = state
            return 200, {}

        return change

    def delete(name: str) -> Reply:
        del schedules[name]
        return 200, {"name": f"{name}/operations/1", "done": True, "response": {"@type": "type.googleapis.com/google.protobuf.Empty"}}

    server.route("POST", f"{_LOCATION}/pipelineJobs", create_job)
    server.route("GET", r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/pipelineJobs/[^/:]+)", get_job)
    server.route("POST", f"{_LOCATION}/schedules", create_schedule)
    server.route("GET", f"{_LOCATION}/schedules", list_schedules)
    schedule = r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/schedules/[^/:]+)"
    server.route("GET", schedule, one_schedule(lambda name: (200, schedules[name])))
    server.route("POST", schedule + ":pause", one_schedule(set_state("PAUSED")))
    server.route("POST", schedule + ":resume", one_schedule(set_state("ACTIVE")))
    server.route("DELETE", schedule, one_schedule(delete))


def add_metadata_routes(server: RecordingServer) -> None:
    """The default metadata store and its contexts (Vertex AI Experiments are contexts of schema
    ``system.Experiment``); adding child contexts records them on the parent."""
    contexts: dict[str, dict[str, Any]] = {}
    store = r"/v1/(?P<store>projects/[^/]+/locations/[^/]+/metadataStores/default)"

    def get_context(request: RecordedRequest, match: re.Match[str]) -> Reply:
        if match["name"] not in contexts:
            return 404, {"error": {"code": 404, "message": f"{match['name']} not found", "status": "NOT_FOUND"}}
        return 200, contexts[match["name"]]

    def create_context(request: RecordedRequest, match: re.Match[str]) -> Reply:
        name = f"{match['store']}/contexts/{request.query['contextId'][0]}"
        if name in contexts:
            return 409, {"error": {"code": 409, "message": f"{name} already exists", "status": "ALREADY_EXISTS"}}
        contexts[name] = {**request.json, "name": name}
        return 200, contexts[name]

    def add_children(request: RecordedRequest, match: re.Match[str]) -> Reply:
        if match["name"] not in contexts:
            return 404, {"error": {"code": 404, "message": f"{match['name']} not found", "status": "NOT_FOUND"}}
        contexts[match["name"]].setdefault("childContexts", []).extend(request.json["childContexts"])
        return 200, {}

    server.route("GET", store, lambda request, match: (200, {"name": match["store"]}))
    server.route("GET", r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/metadataStores/default/contexts/[^/:]+)", get_context)
    server.route("POST", store + "/contexts", create_context)
    server.route(
        "POST", r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/metadataStores/default/contexts/[^/:]+):addContextChildren", add_children
    )


def add_vector_index_routes(server: RecordingServer) -> None:
    """Vector Search indexes of the Vertex AI REST API (v1): create and update answer a done
    operation holding the index (the SDK then reads the index back), as the service does once built."""
    indexes: dict[str, dict[str, Any]] = {}
    ids = itertools.count(1)
    index_type = "type.googleapis.com/google.cloud.aiplatform.v1.Index"

    def done(name: str) -> Reply:
        return 200, {"name": f"{name}/operations/{next(ids)}", "done": True, "response": {"@type": index_type, **indexes[name]}}

    def create(request: RecordedRequest, match: re.Match[str]) -> Reply:
        name = f"{match['parent']}/indexes/{next(ids)}"
        indexes[name] = {**request.json, "name": name}
        return done(name)

    def get(request: RecordedRequest, match: re.Match[str]) -> Reply:
        if match["name"] not in indexes:
            return 404, {"error": {"code": 404, "message": f"{match['name']} not found", "status": "NOT_FOUND"}}
        return 200, indexes[match["name"]]

    def update(request: RecordedRequest, match: re.Match[str]) -> Reply:
        if match["name"] not in indexes:
            return 404, {"error": {"code": 404, "message": f"{match['name']} not found", "status": "NOT_FOUND"}}
        indexes[match["name"]] = {**indexes[match["name"]], "metadata": request.json["metadata"]}
        return done(match["name"])

    server.route("POST", f"{_LOCATION}/indexes", create)
    index = r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/indexes/[^/:]+)"
    server.route("GET", index, get)
    server.route("PATCH", index, update)


_ALIAS = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9-]$")


def add_model_registry_routes(server: RecordingServer) -> dict[str, list[dict[str, Any]]]:
    """Models of the Vertex AI Model Registry (REST v1): upload (a done operation, a new model
    or a new version under ``parentModel``), get (``ID``, ``ID@version``, ``ID@alias``; no
    suffix: the ``default`` version), list versions, and merge version aliases. Aliases behave as
    the service documents them: unique within a model (adding one moves it from the version
    that held it), the first version gets ``default``, and ``default`` cannot be removed.

    Returns the models' versions by model resource name, for tests to seed or inspect."""
    models: dict[str, list[dict[str, Any]]] = {}
    ids = itertools.count(1001)
    model = r"/v1/(?P<model>projects/[^/]+/locations/[^/]+/models/[^/:@%]+)"
    version = model + r"(?:(?:@|%40)(?P<version>[^/:]+))?"

    def error(code: int, status: str, message: str) -> Reply:
        return code, {"error": {"code": code, "message": message, "status": status}}

    def find(name: str, selector: str | None) -> dict[str, Any] | None:
        wanted = selector or "default"
        for item in models.get(name, []):
            if item["versionId"] == wanted or wanted in item["versionAliases"]:
                return item
        return None

    def give(item: dict[str, Any], aliases: Iterable[str]) -> None:
        """Adds ``aliases`` to ``item``, taking each from the version that held it."""
        for alias in aliases:
            for other in models[item["name"]]:
                if alias in other["versionAliases"] and other is not item:
                    other["versionAliases"].remove(alias)
            if alias not in item["versionAliases"]:
                item["versionAliases"].append(alias)

    def upload(request: RecordedRequest, match: re.Match[str]) -> Reply:
        body = request.json
        parent_model = body.get("parentModel")
        if parent_model:
            if parent_model not in models:
                return error(404, "NOT_FOUND", f"Model {parent_model} not found")
            name = parent_model
        else:
            name = f"{match['parent']}/models/{body.get('modelId') or next(ids)}"
            if name in models:
                return error(409, "ALREADY_EXISTS", f"Model {name} already exists")
            models[name] = []
        aliases = list(body["model"].get("versionAliases", []))
        if bad := [a for a in aliases if not _ALIAS.match(a)]:
            return error(400, "INVALID_ARGUMENT", f"invalid version aliases {bad}")
        number = str(len(models[name]) + 1)
        stamp = f"2026-01-01T00:00:{len(models[name]):02d}Z"
        item = {**body["model"], "name": name, "versionId": number, "versionAliases": []}
        item.update(versionCreateTime=stamp, versionUpdateTime=stamp, createTime=stamp)
        models[name].append(item)
        give(item, aliases + (["default"] if number == "1" else []))
        response = {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.UploadModelResponse", "model": name, "modelVersionId": number}
        return 200, {"name": f"{name}/operations/{next(ids)}", "done": True, "response": response}

    def get(request: RecordedRequest, match: re.Match[str]) -> Reply:
        item = find(match["model"], match["version"])
        if item is None:
            return error(404, "NOT_FOUND", f"Model {match['model']}@{match['version'] or 'default'} not found")
        return 200, item

    def list_versions(request: RecordedRequest, match: re.Match[str]) -> Reply:
        if match["model"] not in models:
            return error(404, "NOT_FOUND", f"Model {match['model']} not found")
        return 200, {"models": models[match["model"]]}

    def merge(request: RecordedRequest, match: re.Match[str]) -> Reply:
        item = find(match["model"], match["version"])
        if item is None:
            return error(404, "NOT_FOUND", f"Model {match['model']}@{match['version']} not found")
        changes = request.json.get("versionAliases", [])
        if bad := [a for a in changes if not _ALIAS.match(a.removeprefix("-"))]:
            return error(400, "INVALID_ARGUMENT", f"invalid version aliases {bad}")
        if "-default" in changes:
            return error(400, "FAILED_PRECONDITION", "the default alias cannot be removed; move it to another version")
        give(item, [a for a in changes if not a.startswith("-")])
        item["versionAliases"] = [a for a in item["versionAliases"] if f"-{a}" not in changes]
        return 200, item

    server.route("POST", f"{_LOCATION}/models:upload", upload)
    server.route("GET", version, get)
    server.route("GET", model + ":listVersions", list_versions)
    server.route("POST", version + ":mergeVersionAliases", merge)
    return models


_FILTER_TERM = re.compile(r'^(?P<key>[a-zA-Z_][a-zA-Z0-9_.-]*)\s*=\s*"(?P<value>[^"]*)"$')


def _filter_terms(text: str) -> dict[str, str] | None:
    """A Vertex AI list filter of ``key="value"`` terms joined by ``AND`` (the subset gnnflow
    sends) as key → value; None for anything else, which the routes answer 400."""
    terms: dict[str, str] = {}
    for term in re.split(r"\s+AND\s+", text.strip()) if text.strip() else []:
        match = _FILTER_TERM.match(term.strip())
        if not match or not (match["key"] == "display_name" or match["key"].startswith("labels.")):
            return None
        terms[match["key"]] = match["value"]
    return terms


def _matches(item: dict[str, Any], terms: dict[str, str]) -> bool:
    for key, value in terms.items():
        have = item.get("displayName") if key == "display_name" else item.get("labels", {}).get(key.removeprefix("labels."))
        if have != value:
            return False
    return True


def _bad_filter(text: str) -> Reply:
    return 400, {"error": {"code": 400, "message": f"invalid filter {text!r}", "status": "INVALID_ARGUMENT"}}


def add_model_list_route(server: RecordingServer, models: dict[str, list[dict[str, Any]]]) -> None:
    """Lists the models of :func:`add_model_registry_routes` (pass what it returned), as the
    service does: each model's ``default`` version, filtered by ``display_name`` and ``labels.KEY``."""

    def list_models(request: RecordedRequest, match: re.Match[str]) -> Reply:
        text = request.query.get("filter", [""])[0]
        terms = _filter_terms(text)
        if terms is None:
            return _bad_filter(text)
        found = []
        for name, versions in models.items():
            if not name.startswith(match["parent"] + "/"):
                continue
            default = next((v for v in versions if "default" in v["versionAliases"]), None)
            if default is not None and _matches(default, terms):
                found.append(default)
        return 200, {"models": found}

    server.route("GET", f"{_LOCATION}/models", list_models)


def add_endpoint_routes(server: RecordingServer, models: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, dict[str, Any]]:
    """Endpoints of Vertex AI Prediction (REST v1): create (a done operation holding the endpoint),
    list (filtered by ``display_name`` and ``labels.KEY``), get, and deployModel (a done
    operation). A deployment checks what the service checks: the endpoint exists, the model does
    (when ``models`` from :func:`add_model_registry_routes` is given; ``MODEL@VERSION`` picks a
    version), the replica counts, and a traffic split that names only ``"0"`` (the new
    deployment) and deployed model ids and sums to 100. An empty split gives the first
    deployment 100 % and leaves the endpoint's split alone otherwise.

    Returns the endpoints by resource name, for tests to seed or inspect."""
    endpoints: dict[str, dict[str, Any]] = {}
    endpoint_ids = itertools.count(5001)
    deployed_ids = itertools.count(7001)
    operation_ids = itertools.count(1)
    endpoint = r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/endpoints/[^/:]+)"

    def error(code: int, status: str, message: str) -> Reply:
        return code, {"error": {"code": code, "message": message, "status": status}}

    def done(name: str, response: dict[str, Any]) -> Reply:
        return 200, {"name": f"{name}/operations/{next(operation_ids)}", "done": True, "response": response}

    def create(request: RecordedRequest, match: re.Match[str]) -> Reply:
        name = f"{match['parent']}/endpoints/{request.query.get('endpointId', [str(next(endpoint_ids))])[0]}"
        if name in endpoints:
            return error(409, "ALREADY_EXISTS", f"Endpoint {name} already exists")
        endpoints[name] = {**request.json, "name": name, "deployedModels": [], "trafficSplit": {}}
        return done(name, {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.Endpoint", **endpoints[name]})

    def list_endpoints(request: RecordedRequest, match: re.Match[str]) -> Reply:
        text = request.query.get("filter", [""])[0]
        terms = _filter_terms(text)
        if terms is None:
            return _bad_filter(text)
        found = [e for n, e in endpoints.items() if n.startswith(match["parent"] + "/") and _matches(e, terms)]
        return 200, {"endpoints": found}

    def get(request: RecordedRequest, match: re.Match[str]) -> Reply:
        if match["name"] not in endpoints:
            return error(404, "NOT_FOUND", f"Endpoint {match['name']} not found")
        return 200, endpoints[match["name"]]

    def deploy(request: RecordedRequest, match: re.Match[str]) -> Reply:
        item = endpoints.get(match["name"])
        if item is None:
            return error(404, "NOT_FOUND", f"Endpoint {match['name']} not found")
        body = request.json
        wanted = dict(body["deployedModel"])
        model, _, version = wanted["model"].partition("@")
        if models is not None:
            versions = models.get(model, [])
            chosen = [
                v
                for v in versions
                if v["versionId"] == version or version in v["versionAliases"] or (not version and "default" in v["versionAliases"])
            ]
            if not chosen:
                return error(404, "NOT_FOUND", f"Model {wanted['model']} not found")
            version = chosen[0]["versionId"]
        resources = wanted.get("dedicatedResources", {})
        low, high = int(resources.get("minReplicaCount", 0)), int(resources.get("maxReplicaCount", 0))
        if low < 1 or high < low:
            return error(400, "INVALID_ARGUMENT", f"invalid replica counts: min {low}, max {high}")
        new_id = str(next(deployed_ids))
        split = {k: int(v) for k, v in body.get("trafficSplit", {}).items()}
        known = {d["id"] for d in item["deployedModels"]}
        if unknown := [k for k in split if k != "0" and k not in known]:
            return error(400, "INVALID_ARGUMENT", f"traffic split names deployed models {unknown} that the endpoint does not have")
        if split and sum(split.values()) != 100:
            return error(400, "INVALID_ARGUMENT", f"traffic split sums to {sum(split.values())}, not 100")
        deployed = {**wanted, "id": new_id, "model": model, "modelVersionId": version or "1"}
        item["deployedModels"].append(deployed)
        if split:
            item["trafficSplit"] = {(new_id if k == "0" else k): v for k, v in split.items()}
        elif not known:
            item["trafficSplit"] = {new_id: 100}
        return done(
            match["name"], {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.DeployModelResponse", "deployedModel": deployed}
        )

    server.route("POST", f"{_LOCATION}/endpoints", create)
    server.route("GET", f"{_LOCATION}/endpoints", list_endpoints)
    server.route("GET", endpoint, get)
    server.route("POST", endpoint + ":deployModel", deploy)
    return endpoints


def add_vector_upsert_routes(server: RecordingServer, index: str) -> list[dict[str, Any]]:
    """One Vector Search index with streaming updates (``index``: its resource name): get, and
    upsertDatapoints (each request's datapoints are kept, in order; an empty answer as the
    service gives). Returns the datapoints received."""
    received: list[dict[str, Any]] = []
    name = re.escape(index)

    def upsert(request: RecordedRequest, match: re.Match[str]) -> Reply:
        received.extend(request.json.get("datapoints", []))
        return 200, {}

    described = {"name": index, "displayName": "gnnflow-test", "indexUpdateMethod": "STREAM_UPDATE"}
    server.route("GET", f"/v1/{name}", (200, described))
    server.route("POST", f"/v1/{name}:upsertDatapoints", upsert)
    return received


# ------------------------------------------------------------------------------------ KFP
_KFP = "/apis/v2beta1"


def add_kfp_routes(server: RecordingServer, run_states: Iterable[str] = ("SUCCEEDED",)) -> None:
    """Health, experiments, pipeline upload, runs and recurring runs of the KFP v2beta1 API.

    A created run answers ``PENDING``; each later GET answers the next of ``run_states``.
    """
    experiments: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    recurring: dict[str, dict[str, Any]] = {}
    ids = itertools.count(1)
    states = _states(run_states)

    def list_experiments(request: RecordedRequest, match: re.Match[str]) -> Reply:
        wanted = None
        if request.query.get("filter"):
            predicates = json.loads(request.query["filter"][0])["predicates"]
            wanted = next((p["string_value"] if "string_value" in p else p["stringValue"]) for p in predicates)
        found = [e for e in experiments.values() if wanted is None or e["display_name"] == wanted]
        return 200, {"experiments": found, "total_size": len(found)}

    def create_experiment(request: RecordedRequest, match: re.Match[str]) -> Reply:
        experiment = {**request.json, "experiment_id": f"experiment-{next(ids)}"}
        experiments[experiment["experiment_id"]] = experiment
        return 200, experiment

    def upload(request: RecordedRequest, match: re.Match[str]) -> Reply:
        return 200, {"pipeline_id": f"pipeline-{next(ids)}", "display_name": request.query.get("name", [""])[0]}

    def create_run(request: RecordedRequest, match: re.Match[str]) -> Reply:
        run = {**request.json, "run_id": f"run-{next(ids)}", "state": "PENDING"}
        runs[run["run_id"]] = run
        return 200, run

    def list_runs(request: RecordedRequest, match: re.Match[str]) -> Reply:
        wanted = None
        if request.query.get("filter"):
            predicates = json.loads(request.query["filter"][0])["predicates"]
            wanted = next(p.get("string_value", p.get("stringValue")) for p in predicates if p["key"] == "display_name")
        experiment = request.query.get("experiment_id", [None])[0]
        found = [
            r
            for r in runs.values()
            if (wanted is None or r["display_name"] == wanted) and (experiment is None or r.get("experiment_id") == experiment)
        ]
        return 200, {"runs": found, "total_size": len(found)}

    def get_run(request: RecordedRequest, match: re.Match[str]) -> Reply:
        if match["id"] not in runs:
            return 404, {"error": f"run {match['id']} not found", "code": 5}
        run = runs[match["id"]] = {**runs[match["id"]], "state": next(states)}
        if run["state"] == "FAILED":
            run["error"] = {"code": 2, "message": "task train failed"}
        return 200, run

    def create_recurring(request: RecordedRequest, match: re.Match[str]) -> Reply:
        item = {**request.json, "recurring_run_id": f"recurring-{next(ids)}", "status": "ENABLED"}
        recurring[item["recurring_run_id"]] = item
        return 200, item

    def one_recurring(change: Callable[[str], Reply]) -> Responder:
        def respond(request: RecordedRequest, match: re.Match[str]) -> Reply:
            if match["id"] not in recurring:
                return 404, {"error": f"recurring run {match['id']} not found", "code": 5}
            return change(match["id"])

        return respond

    def set_mode(mode: str, status: str) -> Callable[[str], Reply]:
        def change(key: str) -> Reply:
            recurring[key].update(mode=mode, status=status)
            return 200, {}

        return change

    server.route("GET", f"{_KFP}/healthz", (200, {"multi_user": False}))
    server.route("GET", f"{_KFP}/experiments", list_experiments)
    server.route("POST", f"{_KFP}/experiments", create_experiment)
    server.route("POST", f"{_KFP}/pipelines/upload", upload)
    server.route("POST", f"{_KFP}/runs", create_run)
    server.route("GET", f"{_KFP}/runs", list_runs)
    server.route("GET", f"{_KFP}/runs/(?P<id>[^/:]+)", get_run)
    server.route("POST", f"{_KFP}/recurringruns", create_recurring)
    server.route(
        "GET", f"{_KFP}/recurringruns", lambda r, m: (200, {"recurringRuns": list(recurring.values()), "total_size": len(recurring)})
    )
    item = f"{_KFP}/recurringruns/(?P<id>[^/:]+)"
    server.route("GET", item, one_recurring(lambda key: (200, recurring[key])))
    server.route("POST", item + ":enable", one_recurring(set_mode("ENABLE", "ENABLED")))
    server.route("POST", item + ":disable", one_recurring(set_mode("DISABLE", "DISABLED")))
    server.route("DELETE", item, one_recurring(lambda key: (200, recurring.pop(key) and {})))


# ---------------------------------------------------------------- inputs a submission needs
TEST_IMAGE = "registry.example/gnnflow:test"


def write_inputs(bucket: str, *, config_key: str = "config/gnnflow.yaml") -> str:
    """A small graph (nodes in two files under a prefix, one edge file) and its config, on
    the GCS emulator through the real storage client; returns the config's ``gs://`` URI."""
    from components import storage

    root = f"gs://{bucket}"
    storage.write_text(f"{root}/raw/nodes/part-0.csv", "node_id,label,f0\na,0,0.5\nb,1,1.5\n")
    storage.write_text(f"{root}/raw/nodes/part-1.csv", "node_id,label,f0\nc,0,2.5\n")
    storage.write_text(f"{root}/raw/edges.csv", "src,dst\na,b\nb,c\n")
    config = f"""\
graph:
  nodes:
    - type: paper
      uri: {root}/raw/nodes/
      id_column: node_id
      label_column: label
      features: [{{columns: [f0], transform: standardize}}]
  edges:
    - type: cites
      uri: {root}/raw/edges.csv
      src_type: paper
      dst_type: paper
training: {{epochs: 3}}
output: {{root: {root}/runs}}
"""
    storage.write_text(f"{root}/{config_key}", config)
    return f"{root}/{config_key}"


def compile_package(path: str, image: str = TEST_IMAGE) -> str:
    """gnnflow's pipeline (``pipelines.dag``) compiled to ``path`` for ``image``."""
    from pipelines.dag import compile_pipeline

    compile_pipeline(path, image)
    return path
