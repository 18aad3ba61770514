"""``SchedulerClient``: the trainer side of the packsched sidecar (gRPC, packsched.v1.Scheduler).

    client = packsched.client.SchedulerClient("127.0.0.1:50051")
    plan = client.plan(round=step, seq_lens=lengths, max_token_len=16384, stream="actor_update")
    for indices, meta in zip(plan.micro_batches, plan.metadata): ...

Every rank of a data-parallel group calls ``plan`` with the same stream and round; the sidecars
agree the micro-batch count and the global loss counts, and each rank gets its own ``Plan``
(packsched.plan). The model-parallel ranks of one DP rank may all call their sidecar for the
same round: the round is computed once and served to each of them.

Option values and the arrays' types and shapes are checked before anything is sent, with the
in-process planner's vocabulary and messages (packsched._options, packsched._inputs): a bad name
or value raises ValueError, data that is not integers TypeError, on the calling rank (every rank
passes the same options, so every rank raises). The request data (lengths, loss tokens) and
the planner's limits are judged by the server, so one rank's bad request fails the round on every
rank with the same message. The client retries only failures to reach its own sidecar
(UNAVAILABLE before the server answered), within ``timeout`` seconds, never a round that failed.
Errors raise ``SchedulerError`` with ``.code`` (the gRPC status code name, e.g.
"INVALID_ARGUMENT") and the server's message; a call that got no answer from the sidecar says so,
naming the target and the time waited.
"""

import inspect
from dataclasses import fields as dataclass_fields
import ipaddress
import time

try:
    import grpc
    from google.protobuf import json_format
except ImportError as _e:
    raise ImportError(
        f"packsched.client (SchedulerClient) needs grpcio and protobuf, and {_e.name!r} is "
        "missing: install them with `pip install 'packsched[client]'` (or `pip install grpcio "
        "protobuf`; on Debian `apt-get install python3-grpcio python3-protobuf`). The in-process "
        "planner (packsched.planner), the kernels and packsched.compat work without them."
    ) from _e

from ._inputs import int_array
from ._options import (
    CHOICES,
    LOSS_DEFAULTS,
    PLAN_DEFAULTS,
    SCHEMA,
    WEIGHT_PAIR,
    check_world_size,
    split_options,
)
from .model_cost import model_fields
from .plan import Plan, PlanStats, meta_of
from .planner import SYNCS, Balanced, RankPlan, StepStats, partition
from .tree import Forest, TreePlan
from .v1 import scheduler_pb2, scheduler_pb2_grpc

__all__ = ["SchedulerClient", "SchedulerError"]

_SERVED = "packsched-served"  # trailing metadata on every answer the service itself produced
_CHANNEL_OPTIONS = [
    # Reconnect fast: a rank's sidecar may start after its trainer (gRPC's default backoff is 1 s).
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
]


class SchedulerError(Exception):
    """A failed call. ``code``: gRPC status code name; ``message``: the server's text."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SchedulerClient:
    """A connection to one sidecar.

    target   "host:port" of this rank's sidecar (normally 127.0.0.1:50051); any gRPC target
    timeout  seconds per call, retries of an unreachable sidecar included. The default (120 s) is
             twice the sidecar's default --collective_timeout (60 s): a round waits at most that
             long for its peers and then fails with the server's error naming the missing ranks,
             which only reaches a caller still waiting. Keep it above the sidecar's value.
    token    bearer token (servers started with --auth_token_file); the server accepts it only
             over TLS or on loopback, so a token without ``tls`` to a target that is not loopback
             (127.0.0.0/8, ::1, localhost, unix:) raises ValueError instead of sending it in clear
    tls      None (plaintext), True (TLS with the system's roots), or a dict with any of
             root_certificates, certificate_chain, private_key (PEM bytes or file paths)
    """

    def __init__(self, target, timeout=120.0, token=None, tls=None):
        if token and not tls and not _is_loopback(target):
            raise ValueError(
                f"SchedulerClient: a bearer token is sent only over TLS or to a loopback address; "
                f"target {target!r} is neither (pass tls=True or tls={{...}})"
            )
        self._target = target
        self._timeout = float(timeout)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        if tls:
            pem = tls if isinstance(tls, dict) else {}
            creds = grpc.ssl_channel_credentials(**{k: _pem(v) for k, v in pem.items()})
            self._channel = grpc.secure_channel(target, creds, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def plan(self, round, seq_lens, max_token_len, *, stream="default", **options):
        """One rank's plan for (stream, round). Keyword options and defaults as
        packsched.planner.plan_local (see packsched._options). ``seq_lens`` may be a
        packsched.tree.Forest: tree packing, a TreePlan back (loss_tokens per rollout). -> Plan"""
        plan_options, loss = split_options(
            max_token_len, options, where="plan", cap_required=True, sidecar=True
        )
        request = scheduler_pb2.PlanRequest(stream=stream, round=int(round))
        _fill_input(request, seq_lens)
        _fill_options(request.options, plan_options)
        _fill_loss(request, loss)
        return _answer(self._call(self._stub.Plan, request), seq_lens)

    def partition(
        self,
        seq_lens,
        num_micro_batches,
        max_token_len=None,
        *,
        global_counts=None,
        world_size=1,
        **options,
    ):
        """Exactly ``num_micro_batches`` micro-batches (a count the caller agreed itself; no
        collective). ``global_counts``: (loss tokens, sequences with loss) summed by the caller
        over ``world_size`` DP ranks; without them the weights use this rank's own counts and
        world size 1, so ``world_size`` != 1 without ``global_counts`` raises ValueError (as
        packsched.planner.partition does). A rank with no sequences (empty ``seq_lens``) gets
        ``num_micro_batches`` empty micro-batches from the in-process planner, as
        packsched.planner.partition gives them (the sidecar refuses an empty request; a
        partition involves no other rank). -> Plan"""
        plan_options, loss = split_options(max_token_len, options, where="partition", sidecar=True)
        world_size = check_world_size("partition", global_counts, world_size)
        request = scheduler_pb2.PartitionRequest(num_micro_batches=int(num_micro_batches))
        lengths = _fill_input(request, seq_lens, allow_empty=True)
        if lengths is not None and not lengths:
            return partition(
                lengths,
                num_micro_batches,
                max_token_len,
                global_counts=global_counts,
                world_size=world_size,
                **options,
            )
        _fill_options(request.options, plan_options)
        _fill_loss(request, loss)
        if global_counts is not None:
            counts = {name: int(global_counts[i]) for i, name in enumerate(_LOSS_COUNTS)}
            getattr(request, "global").CopyFrom(
                scheduler_pb2.GlobalCounts(**counts, world_size=int(world_size))
            )
        return _answer(self._call(self._stub.Partition, request), seq_lens)

    def balance_batch(
        self,
        seq_lens,
        world_size,
        max_token_len,
        *,
        group_ids=None,
        sync="step",
        micro_batch_cost=0,
        model_config=None,
        **options,
    ):
        """Coordinator mode: the whole global batch over ``world_size`` DP ranks; ``sync``,
        ``micro_batch_cost`` and ``model_config`` (a dict or the path of a config.json: the
        sidecar costs the batch by the model's FLOPs) as in ``packsched.planner.balance``.
        -> Balanced"""
        if sync not in SYNCS:
            raise ValueError(f"sync = {sync!r}: must be one of {', '.join(SYNCS)}")
        plan_options, loss = split_options(
            max_token_len, options, where="balance_batch", cap_required=True, sidecar=True
        )
        request = scheduler_pb2.BalanceBatchRequest(
            world_size=int(world_size),
            sync=SYNCS.index(sync) + 1,
            micro_batch_cost=int(micro_batch_cost),
        )
        _fill_input(request, seq_lens)
        if group_ids is not None:
            request.group_ids.extend(_ints(group_ids, "group_ids", allow_empty=True))
        if model_config is not None:
            ints, strings = model_fields(model_config)
            request.model_config.ints.update(ints)
            request.model_config.strings.update(strings)
        _fill_options(request.options, plan_options)
        _fill_loss(request, loss)
        response = self._call(self._stub.BalanceBatch, request)
        ranks = [
            RankPlan(list(r.indices), r.cost, _answer(r.plan, seq_lens)) for r in response.ranks
        ]
        step = StepStats(
            **{f.name: getattr(response.step, f.name) for f in dataclass_fields(StepStats)}
        )
        return Balanced(ranks, response.num_micro_batches, list(response.dropped), step)

    def plan_dynamic_cp(
        self,
        seq_lens,
        world_size,
        max_tokens_per_rank,
        *,
        rank=None,
        owner_ranks=None,
        model_config=None,
        loss_tokens=None,
        stream=None,
        round=0,
        **options,
    ):
        """Dynamic context parallelism on the sidecar (PlanDynamicCp; in process:
        ``packsched.dynamic_cp``): the whole step ``seq_lens`` over ``world_size`` ranks, each
        sequence on a CP group of the size it needs. ``options``: the fields of the proto's
        DynamicCpOptions (``sizes`` by name: "powers_of_two", "divisors", "any") and the loss
        options of ``balance_batch`` (with ``loss_tokens``); ``owner_ranks``:
        per sequence the rank whose data holds it; ``rank``: only that rank's view. Every rank that
        sends the same step gets the same plan (equal ``plan_fingerprint``). ``stream`` (and its
        ``round``, as ``plan``'s): the sidecars first agree in one round of that stream that every
        rank sent the same step (a rank that differs fails it everywhere: SchedulerError
        FAILED_PRECONDITION). -> a dict with the
        proto's field names: num_micro_batches, group_names, ranks (per rank its slots: group,
        ranks, cp_rank, sequences, owner_ranks, owner_indices, cu_seqlens, shard_chunks,
        tokens_per_rank, loss_weights), cp_of_sequence, slot_of_sequence, step_cost, lower_bound,
        comm_tokens, options (applied; ``sizes`` by name) and plan_fingerprint; integers as ints,
        lists as lists."""
        request = scheduler_pb2.PlanDynamicCpRequest(world_size=int(world_size))
        _fill_input(request, seq_lens)
        request.options.max_tokens_per_rank = int(max_tokens_per_rank)
        loss = {k: options.pop(k, v) for k, v in LOSS_DEFAULTS.items()}
        loss["loss_tokens"] = loss_tokens
        fields = request.options.DESCRIPTOR.fields_by_name
        for name, value in options.items():
            field = fields.get(name)
            if field is None or name == "max_tokens_per_rank":
                raise ValueError(f"plan_dynamic_cp: unknown option {name!r}")
            if field.enum_type is not None:
                prefix = field.enum_type.values_by_number[0].name[: -len("UNSPECIFIED")]
                number = field.enum_type.values_by_name.get(prefix + str(value).upper())
                if number is None or number.number == 0:
                    raise ValueError(f"plan_dynamic_cp: {name} = {value!r} is not a known name")
                value = number.number
            elif field.type == field.TYPE_DOUBLE:
                value = float(value)
            else:
                value = int(value)
            setattr(request.options, name, value)
        if rank is not None:
            request.rank = int(rank)
        if stream is not None:
            request.stream = stream
        request.round = int(round)
        if owner_ranks is not None:
            request.owner_ranks.extend(_ints(owner_ranks, "owner_ranks", allow_empty=True))
        if model_config is not None:
            ints, strings = model_fields(model_config)
            request.model_config.ints.update(ints)
            request.model_config.strings.update(strings)
        _fill_loss(request, loss)
        return _to_python(self._call(self._stub.PlanDynamicCp, request))

    def status(self):
        """The sidecar's rank, world size, group readiness, backend, streams and counters, as a
        dict with the proto's field names."""
        response = self._call(self._stub.GetStatus, scheduler_pb2.GetStatusRequest())
        return _to_dict(response)

    def _call(self, method, request):
        start = time.monotonic()
        deadline = start + self._timeout
        backoff = 0.05
        while True:
            remaining = deadline - time.monotonic()
            try:
                response, call = method.with_call(
                    request,
                    timeout=max(remaining, 0.001),
                    metadata=self._metadata,
                    wait_for_ready=True,
                )
                return response
            except grpc.RpcError as error:
                served = any(key == _SERVED for key, _ in (error.trailing_metadata() or ()))
                code = error.code()
                unreached = code == grpc.StatusCode.UNAVAILABLE and not served
                if unreached and time.monotonic() + backoff < deadline:
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
                if not served and code in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise SchedulerError(
                        code.name, self._no_answer(time.monotonic() - start, error.details())
                    ) from None
                raise SchedulerError(code.name, error.details()) from None

    def _no_answer(self, waited, details):
        """The message of a call the sidecar never answered (no packsched-served trailer)."""
        return (
            f"no answer from the sidecar at {self._target} after {waited:.1f} s "
            f"(timeout {self._timeout:g} s; gRPC: {details}): either it cannot be reached "
            "there (is packsched-server running and listening on that address?) or a round "
            "outlasted this client's timeout (keep the timeout above the sidecar's "
            "--collective_timeout, default 60 s, so the sidecar's own error, naming any "
            "missing rank, arrives first)"
        )


def _pem(value):
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def _ints(values, name, allow_empty=False):
    # The in-process planner's check and messages (packsched._inputs).
    return int_array(values, name, allow_empty=allow_empty).tolist()


def _enum(key, value):
    # `value` passed packsched._options' check; the proto's value of a name is its index + 1.
    return CHOICES[key].index(value) + 1


def _is_loopback(target):
    """Whether every address of the gRPC ``target`` is loopback: 127.0.0.0/8, ::1, localhost or
    a unix: socket (the server's rule for accepting a bearer token without TLS)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    if target.startswith(("ipv4:", "ipv6:")):
        hosts = target.split(":", 1)[1].split(",")
    else:
        if target.startswith("dns:"):
            target = target[len("dns:") :]
            if target.startswith("//"):  # dns://authority/host:port
                target = target[2:].partition("/")[2]
        hosts = [target]
    return all(_is_loopback_host(_host_of(address)) for address in hosts)


def _host_of(address):
    if address.startswith("["):
        return address[1:].partition("]")[0]
    if address.count(":") == 1:
        return address.partition(":")[0]
    return address  # no port, or a bare IPv6 address


def _is_loopback_host(host):
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _to_dict(message):
    """MessageToDict with every field printed, on protobuf before and after 5.26 (which renamed
    including_default_value_fields to always_print_fields_with_no_presence)."""
    keywords = inspect.signature(json_format.MessageToDict).parameters
    if "always_print_fields_with_no_presence" in keywords:
        every_field = {"always_print_fields_with_no_presence": True}
    else:
        every_field = {"including_default_value_fields": True}
    return json_format.MessageToDict(message, preserving_proto_field_name=True, **every_field)


def _to_python(message):
    """A message as a dict of its fields by name: ints, floats, lists, dicts; an enum by its
    lower-case name after the enum's prefix ("divisors")."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.type == field.TYPE_MESSAGE:
            convert = _to_python
        elif field.enum_type is not None:
            prefix = field.enum_type.values_by_number[0].name[: -len("UNSPECIFIED")]

            def convert(v, e=field.enum_type, p=prefix):
                return e.values_by_number[v].name[len(p) :].lower()

        else:

            def convert(v):
                return v

        is_list = field.is_repeated if hasattr(field, "is_repeated") else field.label == 3
        out[field.name] = [convert(v) for v in value] if is_list else convert(value)
    return out


# The schema table's fields (packsched._options.SCHEMA), by what each needs on the wire.
_PLAN_FIELDS = [(f["name"], f["rule"]) for f in SCHEMA["plan_options"]]
_ROUND_FIELDS = [f["name"] for f in SCHEMA["round_options"]]
_LOSS_FIELDS = [(f["name"], f["rule"], f["key"]) for f in SCHEMA["loss_options"]]
_PART_FIELDS = [(f["name"], f["kind"]) for f in SCHEMA["micro_batch"]]
_STATS_FIELDS = [(f["name"], f["kind"], f["alias"]) for f in SCHEMA["plan_stats"]]
# The response's field of each kind (Indices: several, _INDEX_LISTS).
_RESPONSE = {f["kind"]: f["name"] for f in SCHEMA["plan_response"]}
_INDEX_LISTS = [f["name"] for f in SCHEMA["plan_response"] if f["kind"] == "Indices"]
_LOSS_COUNTS = [f["name"] for f in SCHEMA["global_counts"] if f["kind"] == "Loss"]
_LOSS_SCALE = next(name for name, kind in _PART_FIELDS if kind == "LossScale")
# A forest's arrays sent: the required ones (the Checked rollout lengths are the forest's own).
_FOREST_SENT = [f["name"] for f in SCHEMA["forest"] if f["kind"] != "Checked"]


def _fill_options(msg, o):
    weight = 0
    for name, rule in _PLAN_FIELDS:
        if rule in ("Cap", "Unlimited"):
            setattr(msg, name, int(o[name] or 0))
        elif rule in ("Count", "Align"):
            setattr(msg, name, int(o[name]))
        elif rule == "Enum":
            setattr(msg, name, _enum(name, o[name]))
        elif rule == "Weight":
            if o[WEIGHT_PAIR] is not None:
                setattr(msg, name, int(o[WEIGHT_PAIR][weight]))
            weight += 1
        elif rule == "Ceiling":
            if o[name] != PLAN_DEFAULTS[name]:
                setattr(msg, name, int(o[name]))  # else 0: the server's own limit
        elif rule == "FixedK":
            setattr(msg, name, bool(o[name]))
        else:
            raise AssertionError(f"no wire rule for {rule} ({name})")
    for name in _ROUND_FIELDS:
        setattr(msg, name, bool(o[name]))


def _fill_loss(request, loss):
    if loss["loss_tokens"] is not None:
        request.loss_tokens.extend(_ints(loss["loss_tokens"], "loss_tokens", allow_empty=True))
    for name, rule, key in _LOSS_FIELDS:
        value = _enum(key, loss[key]) if rule == "Enum" else float(loss[key])
        setattr(request.loss, name, value)


def _fill_input(request, seq_lens, allow_empty=False):
    """The request's lengths (checked by packsched._inputs; returned as a list), or its forest
    (tree packing; None returned) for a packsched.tree.Forest, whose arrays its constructor
    checked."""
    if isinstance(seq_lens, Forest):
        for name in _FOREST_SENT:
            getattr(request.forest, name).extend(getattr(seq_lens, name).tolist())
        return None
    lengths = _ints(seq_lens, "seq_lens", allow_empty=allow_empty)
    request.lengths.extend(lengths)
    return lengths


def _answer(response, seq_lens):
    return _to_tree_plan(response, seq_lens) if isinstance(seq_lens, Forest) else _to_plan(response)


def _to_tree_plan(response, forest):
    """TreePlan of a packsched.v1.PlanResponse to a request for ``forest``."""
    tree = response.tree
    fields = {}
    for f in SCHEMA["tree_plan"]:
        value = getattr(tree, f["name"])
        if f["kind"] == "Layouts":
            value = [
                {g["name"]: list(getattr(layout, g["name"])) for g in SCHEMA["tree_layout"]}
                for layout in value
            ]
        elif f["kind"] == "Ints":
            value = list(value)
        fields[f["name"]] = value
    return TreePlan.from_plan(_to_plan(response), forest=forest, **fields)


def _part(mb):
    """MicroBatchMeta of one packsched.v1.MicroBatch."""
    fields = {}
    for name, kind in _PART_FIELDS:
        if kind == "Ints":
            fields[name] = list(getattr(mb, name))
        elif kind == "LossScale":
            fields[name] = getattr(mb, name) if mb.HasField(name) else None
        else:
            fields[name] = getattr(mb, name)
    return meta_of(fields)


def _stats(response):
    """PlanStats of a packsched.v1.PlanResponse: the planner's figures, this rank's bound, and the
    sidecar's cap (alias) and timings (alias_ms, from microseconds)."""
    s = response.stats
    fields = {}
    for name, kind, alias in _STATS_FIELDS:
        if kind in ("Int", "Double"):
            fields[name] = getattr(s, name)
        elif kind == "LocalK":
            fields[name] = getattr(response, _RESPONSE["LocalK"])
        elif kind == "Cap":
            fields[alias] = getattr(s, name)
        elif kind == "Micros":
            fields[f"{alias}_ms"] = getattr(s, name) / 1000
    return PlanStats(**fields)


def _to_plan(response):
    metadata = [_part(mb) for mb in getattr(response, _RESPONSE["Parts"])]
    weights = getattr(response, _RESPONSE["Weights"])
    has_loss = len(weights) > 0
    counts = getattr(response, _RESPONSE["Global"])  # "global": a Python keyword
    return Plan(
        num_micro_batches=getattr(response, _RESPONSE["Count"]),
        local_num_micro_batches=getattr(response, _RESPONSE["LocalK"]),
        micro_batches=[m.indices for m in metadata],
        metadata=metadata,
        **{name: list(getattr(response, name)) for name in _INDEX_LISTS},
        loss_weights=list(weights) if has_loss else None,
        loss_scales=[getattr(m, _LOSS_SCALE) for m in metadata] if has_loss else None,
        empty=[m.empty for m in metadata],
        stats=_stats(response),
        global_counts=tuple(getattr(counts, name) for name in _LOSS_COUNTS) if has_loss else None,
    )
