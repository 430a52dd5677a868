"""kvown-events' KV-event stream decoded by vLLM's and sglang's own event classes.

For each dialect and each engine version this claims (README "Behind a KV-aware router"), the
released wheel is fetched without its dependencies (`pip download --no-deps`), and its
`kv_events.py` is loaded with stub modules for the engine's heavy imports (torch, its config,
its logger): the event classes (msgspec structs) and the replay code are the wheel's own.
kvown's `event_stream` example publishes a scripted stream (every event kind, three
namespaces, evictions, restarts) over real ZMQ sockets; a SUB socket receives it and every
batch is decoded with `msgspec.msgpack.Decoder(type=KVEventBatch)` of every version, as the
engines' consumers decode it, and every field is compared with what kvown published. The
replay socket is asked, by a DEALER sending `["", start]` as vLLM's and Dynamo's clients do,
from a sequence number, from 0 and past the end; its replies must equal, frame for frame, those
of the version's own `ZmqEventPublisher._service_replay` serving the same batches.

Run by `scripts/event-decoders.sh`, which makes the virtual environment (msgspec, pyzmq) and
builds the example. Exits 1 when a claimed version fails to decode a batch, finds a field
different from what kvown published, or frames a replay otherwise.
"""

import argparse
import ast
import collections
import importlib.abc
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import types
import typing
import zipfile
from pathlib import Path

import msgspec
import zmq

# Per dialect: (engine, version, what is claimed for it). "events": every batch decodes with
# every field equal; "replay": replay replies framed as the version's own publisher frames
# them. The oldest and newest version of each claim.
CLAIMS = {
    "vllm": [
        ("vllm", "0.24.0", {"events"}),
        ("vllm", "0.26.0", {"events", "replay"}),
        ("vllm", "0.34.0", {"events", "replay"}),
    ],
    "vllm-legacy": [
        ("vllm", "0.11.0", {"events", "replay"}),
        ("vllm", "0.23.0", {"events", "replay"}),
        ("sglang", "0.5.15", {"events", "replay"}),
        ("sglang", "0.5.19", {"events", "replay"}),
    ],
    "sglang": [
        ("sglang", "0.5.20", {"events"}),
        ("sglang", "0.5.22", {"events", "replay"}),
        ("sglang", "0.5.23", {"events", "replay"}),
    ],
}

# Where each engine keeps its event classes and publisher, and the module defining vLLM's
# `ExternalBlockHash` (a real type the classes use; everything else imported is stubbed).
EVENTS_MODULE = {
    "vllm": "vllm/distributed/kv_events.py",
    "sglang": "sglang/srt/disaggregation/kv_events.py",
}
BLOCK_HASH_MODULE = "vllm/v1/core/kv_cache_utils.py"

# Any wheel holds the same Python files: the platforms and the Python these were built for.
WHEEL_TAGS = [
    "--python-version", "3.11",
    "--platform", "manylinux_2_35_x86_64",
    "--platform", "manylinux_2_34_x86_64",
    "--platform", "manylinux_2_28_x86_64",
    "--platform", "manylinux1_x86_64",
]

TOPIC = "kv@replica-0"
WAIT_S = 10.0


class Stub:
    """Whatever a stubbed module hands out: callable, subclassable, with any attribute."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return Stub()

    def __getattr__(self, name):
        return Stub()

    def __class_getitem__(cls, item):
        return cls


class StubModule(types.ModuleType):
    """A module whose every attribute is a fresh `Stub` subclass (or a value given)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        stub = type(name, (Stub,), {})
        setattr(self, name, stub)
        return stub


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stubs every module under the given top-level names."""

    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.insert(0, StubFinder({"vllm", "sglang", "torch", "pydantic", "numpy"}))


def fetch(engine, version, cache):
    """The version's event module (and vLLM's block-hash module), from the cache or from its
    wheel, fetched without dependencies. Returns (folder, seconds, bytes downloaded)."""
    folder = cache / f"{engine}-{version}"
    wanted = [EVENTS_MODULE[engine]] + ([BLOCK_HASH_MODULE] if engine == "vllm" else [])
    if all((folder / name).exists() for name in wanted):
        return folder, 0.0, 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache) as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             *WHEEL_TAGS, "--no-cache-dir", "--quiet", "--dest", download,
             f"{engine}=={version}"],
            check=True,
        )
        (wheel,) = Path(download).glob("*.whl")
        size = wheel.stat().st_size
        with zipfile.ZipFile(wheel) as archive:
            for name in wanted:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(archive.read(name))
    return folder, time.monotonic() - started, size


def block_hash_type(path):
    """vLLM's `ExternalBlockHash` as its `kv_cache_utils.py` defines it."""
    for node in ast.parse(path.read_text()).body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "ExternalBlockHash":
            names = {"Union": typing.Union, "bytes": bytes, "int": int}
            return eval(compile(ast.Expression(node.value), str(path), "eval"), names)
    raise LookupError(f"{path}: no ExternalBlockHash")


def load(engine, version, folder):
    """The version's `kv_events` module, executed with its heavy imports stubbed."""
    if engine == "vllm":
        utils = StubModule("vllm.v1.core.kv_cache_utils")
        utils.ExternalBlockHash = block_hash_type(folder / BLOCK_HASH_MODULE)
        sys.modules[utils.__name__] = utils
    name = f"kvown_check_{engine}_{version.replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(name, folder / EVENTS_MODULE[engine])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_event(dialect, event):
    """The tag and the fields the dialect's engine sends for `event` (kvown's description of
    it): vLLM keys an adapter's name into `lora_name` and every block's `extra_keys` and its id
    into `lora_id`, a salt into the first block of its key's `extra_keys`; sglang sends the salt
    and the adapter's name at the top level and `lora_id` nil."""
    if event["kind"] == "cleared":
        return "AllBlocksCleared", {}
    if event["kind"] == "removed":
        return "BlockRemoved", {"block_hashes": event["block_hashes"], "medium": event["medium"]}
    lora = event["label"] if event["label_field"] == "lora" else None
    salt = event["label"] if event["label_field"] == "salt" else None
    fields = {name: event[name] for name in
              ("block_hashes", "parent_block_hash", "token_ids", "block_size", "medium")}
    if dialect == "sglang":
        fields.update(lora_id=None, cache_salt=salt, lora_name=lora)
    else:
        first_salt = salt if event["parent_block_hash"] is None else None
        extra_keys = [([lora] if lora else []) + ([first_salt] if first_salt and page == 0
                                                  else []) or None
                      for page in range(len(event["block_hashes"]))]
        fields.update(lora_id=event["namespace"] if lora else None, lora_name=lora,
                      extra_keys=extra_keys if any(extra_keys) else None)
    return "BlockStored", fields


def plain(value):
    """A decoded value with tuples as lists, to compare with JSON."""
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def struct_default(struct, field):
    """A msgspec struct field's default; `KeyError` when it has none."""
    fields, defaults = struct.__struct_fields__, struct.__struct_defaults__
    at = fields.index(field) - (len(fields) - len(defaults))
    if at < 0:
        raise KeyError(field)
    return defaults[at]


class VersionCheck:
    """One engine version's decoding of one stream."""

    def __init__(self, dialect, engine, version, claims, module):
        self.dialect, self.engine, self.version, self.claims = dialect, engine, version, claims
        self.module = module
        self.decoder = msgspec.msgpack.Decoder(type=module.KVEventBatch)
        self.decoded = 0
        self.failures = []
        self.mismatches = []
        self.kinds = collections.Counter()
        self.not_fields = collections.Counter()
        self.replay_requests = 0
        self.replay_equal = 0
        self.replay_differences = []

    def check_batch(self, payload, published):
        """Decodes `payload`, which kvown published as `published`, and compares every field."""
        try:
            batch = self.decoder.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError) as error:
            self.failures.append(f"batch {published['seq']}: {error}")
            return
        self.decoded += 1
        seq = published["seq"]
        ts, events, rank = (getattr(batch, field) for field in batch.__struct_fields__)
        self.compare(seq, "timestamp", ts, published["timestamp"])
        self.compare(seq, batch.__struct_fields__[2], rank, published["rank"])
        if len(events) != len(published["events"]):
            self.compare(seq, "events", len(events), len(published["events"]))
            return
        for index, (event, described) in enumerate(zip(events, published["events"])):
            tag, fields = expected_event(self.dialect, described)
            self.kinds[tag] += 1
            self.compare(seq, f"event {index} type", type(event).__name__, tag)
            for field in event.__struct_fields__:
                try:
                    expected = fields[field] if field in fields else struct_default(event, field)
                except KeyError:
                    expected = f"<{field} not published>"
                self.compare(seq, f"event {index} {field}", plain(getattr(event, field)),
                             expected)
            for field, value in fields.items():
                if field not in event.__struct_fields__ and value is not None:
                    self.not_fields[field] += 1

    def compare(self, seq, what, got, expected):
        if got != expected:
            self.mismatches.append(f"batch {seq} {what}: decoded {got!r}, published {expected!r}")

    def ok(self, published):
        events_ok = self.decoded == published and not self.failures and not self.mismatches
        replay_ok = "replay" not in self.claims or (
            self.replay_requests > 0 and self.replay_equal == self.replay_requests)
        return events_ok and replay_ok


def recv_all(socket, deadline):
    """Every message on `socket` until it is quiet for 0.5 s or `deadline` passes."""
    messages = []
    while time.monotonic() < deadline and socket.poll(500):
        messages.append(socket.recv_multipart())
    return messages


def replay(dealer, start, serve=None):
    """The replies, after the delimiter, to a DEALER's `["", start]`; `serve` answers the
    request when the ROUTER is served on this thread (an engine's own `_service_replay`)."""
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    if serve is not None:
        serve()
    end = (-1).to_bytes(8, "big", signed=True)
    replies = []
    while dealer.poll(int(WAIT_S * 1000)):
        frames = dealer.recv_multipart()
        replies.append(frames[1:])
        if end in frames:
            return replies
    raise TimeoutError(f"no end of the replay from {start}")


def engine_replay_server(context, module, payloads):
    """A ROUTER socket answered by the version's own `ZmqEventPublisher._service_replay`,
    keeping `payloads`; returns (endpoint, serve one request)."""
    publisher = object.__new__(module.ZmqEventPublisher)
    publisher._replay = context.socket(zmq.ROUTER)
    publisher._replay.setsockopt(zmq.LINGER, 0)
    publisher._replay.bind("tcp://127.0.0.1:*")
    publisher._buffer = collections.deque(sorted(payloads.items()))
    publisher._topic_bytes = TOPIC.encode()

    def serve():
        if not publisher._replay.poll(int(WAIT_S * 1000)):
            raise TimeoutError("no replay request reached the engine's socket")
        publisher._service_replay()

    endpoint = publisher._replay.getsockopt(zmq.LAST_ENDPOINT).decode()
    return endpoint, serve


def run_stream(stream, dialect, field, checks):
    """Runs kvown's stream in `dialect` with namespaces as `field`, decodes it with every
    version of `checks`, and checks the replay socket against each version's own."""
    context = zmq.Context()
    process = subprocess.Popen(
        [stream, "--dialect", dialect, "--namespace-field", field, "--topic", TOPIC],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        endpoints = json.loads(process.stdout.readline())
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        sub.connect(endpoints["endpoint"])
        time.sleep(0.5)  # the subscription reaches the PUB socket
        process.stdin.write("go\n")
        process.stdin.flush()
        published = json.loads(process.stdout.readline())["batches"]
        messages = recv_all(sub, time.monotonic() + WAIT_S)
        payloads = {}
        for topic, seq, payload in messages:
            assert topic == TOPIC.encode(), topic
            payloads[int.from_bytes(seq, "big")] = payload
        live = len(payloads)
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoints["replay_endpoint"])
        missing = [batch["seq"] for batch in published if batch["seq"] not in payloads]
        if missing:
            for frames in replay(dealer, missing[0])[:-1]:
                payloads.setdefault(int.from_bytes(frames[-2], "big"), frames[-1])
        for check in checks:
            for batch in published:
                if batch["seq"] in payloads:
                    check.check_batch(payloads[batch["seq"]], batch)
                else:
                    check.failures.append(f"batch {batch['seq']}: never received")
        count = len(published)
        starts = [0, count // 2, count - 1, count, count + 1000]
        ours = {start: replay(dealer, start) for start in starts}
        for check in checks:
            endpoint, serve = engine_replay_server(context, check.module, payloads)
            engine_dealer = context.socket(zmq.DEALER)
            engine_dealer.setsockopt(zmq.LINGER, 0)
            engine_dealer.connect(endpoint)
            for start in starts:
                theirs = replay(engine_dealer, start, serve)
                check.replay_requests += 1
                if theirs == ours[start]:
                    check.replay_equal += 1
                else:
                    check.replay_differences.append(
                        f"from {start}: kvown {ours[start][-1]!r}, engine {theirs[-1]!r}")
        return count, live
    finally:
        process.stdin.close()
        process.wait(timeout=WAIT_S)
        context.destroy(linger=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", required=True, help="kvown-events' event_stream example")
    parser.add_argument("--cache", required=True, type=Path, help="where wheels' files go")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    modules, fetched, fetch_seconds = {}, 0, 0.0
    versions = {(engine, version) for claims in CLAIMS.values() for engine, version, _ in claims}
    for engine, version in sorted(versions):
        folder, seconds, size = fetch(engine, version, args.cache)
        fetched += size
        fetch_seconds += seconds
        modules[engine, version] = load(engine, version, folder)
    print(f"engine wheels: {len(modules)} versions, {fetched / 1e6:.0f} MB downloaded in "
          f"{fetch_seconds:.1f} s")
    header = (f"{'dialect':<12} {'namespaces':<10} {'engine':<7} {'version':<8} "
              f"{'decoded/published':>17} {'stored/removed/cleared':>22} {'mismatches':>10}  "
              f"{'replay frames = engine':<24} fields this version lacks")
    print(header)
    failed = False
    for dialect, claims in CLAIMS.items():
        for field in ("lora", "salt"):
            checks = [VersionCheck(dialect, engine, version, claimed, modules[engine, version])
                      for engine, version, claimed in claims]
            published, live = run_stream(args.stream, dialect, field, checks)
            for check in checks:
                kinds = "/".join(str(check.kinds[tag]) for tag in
                                 ("BlockStored", "BlockRemoved", "AllBlocksCleared"))
                replay_note = f"{check.replay_equal}/{check.replay_requests}"
                if "replay" not in check.claims:
                    replay_note += " (not claimed)"
                lacks = ", ".join(f"{name} ({count})" for name, count in
                                  sorted(check.not_fields.items())) or "-"
                print(f"{dialect:<12} {field:<10} {check.engine:<7} {check.version:<8} "
                      f"{f'{check.decoded}/{published}':>17} {kinds:>22} "
                      f"{len(check.mismatches):>10}  {replay_note:<24} {lacks}")
                for problem in (check.failures + check.mismatches)[:5]:
                    print(f"    {problem}")
                if "replay" in check.claims:
                    for difference in check.replay_differences[:2]:
                        print(f"    replay {difference}")
                if not check.ok(published):
                    failed = True
            print(f"{'':<12} {'':<10} ({live} of {published} batches live, the rest by replay)")
    if failed:
        print("event decoders: a claimed engine version did not read kvown's stream as published")
        sys.exit(1)
    print("event decoders: every claimed engine version decoded every batch, every field equal")


if __name__ == "__main__":
    main()
