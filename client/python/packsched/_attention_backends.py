"""Which implementation runs one attention call of packsched.kernels (varlen_attention and
tree_attention with torch tensors): packsched's own kernels, torch's ``varlen_attn``,
FlashAttention's ``flash_attn_varlen_func`` or FlexAttention (docs/design.md, "Attention
backends").

The choice, per call:
1. the ``backend=`` argument when given (not "auto"): it runs, or ValueError says why it cannot;
2. else the environment variable PACKSCHED_ATTENTION_BACKEND (read per call) when set and not
   "auto": it runs where it can, and packsched's kernels where it cannot (the reason is logged);
3. else the shipped table (attention_backends.json, measured by the GPU kit): its most specific
   entry that matches the call names backends in order of preference; the first that can run the
   call runs, packsched's kernels last.
Under torch.compile tracing only 1 applies (else packsched's kernels): the table and the
environment stay outside the graph.

A backend can run a call when it is importable and supports everything the call uses
(``unsupported``): varlen_attn and flash_attn take flat masks only, on CUDA, in float16 and
bfloat16, without pad slots (seqused), a tail or the lse; FlexAttention takes flat and tree masks
of the self-attention layout, and on the CPU the forward only (torch has no FlexAttention
backward there). Each distinct choice is logged once (logger "packsched.attention", INFO): which
backend ran, for what, and why.
"""

import dataclasses
import importlib.util
import json
import logging
import os
import pathlib

BACKENDS = ("packsched", "varlen_attn", "flash_attn", "flex")
AUTO = "auto"
ENVIRONMENT = "PACKSCHED_ATTENTION_BACKEND"
FLAT_ONLY = frozenset({"varlen_attn", "flash_attn"})
MASKS = ("full", "causal", "window", "tree")
TABLE_PATH = pathlib.Path(__file__).with_name("attention_backends.json")
_ENTRY_KEYS = ("device", "dtype", "head_dim", "mask", "tokens_bucket", "backends", "evidence")

logger = logging.getLogger("packsched.attention")


@dataclasses.dataclass(frozen=True)
class Call:
    """What the choice needs to know of one attention call.

    device: "cpu", "cuda:sm_90" (CUDA with its compute capability), or another device type.
    dtype: torch's dtype name ("bfloat16"). mask: one of MASKS ("window": any window, causal or
    not). tokens: the query rows. The rest says which features the call uses: softcap,
    seqused (pad slots), tail (rows past the last offset), cross (q and k offsets may differ),
    grad (gradients are needed), lse (the caller asked for the lse)."""

    device: str
    dtype: str
    head_dim: int
    mask: str
    tokens: int
    softcap: bool = False
    seqused: bool = False
    tail: bool = False
    cross: bool = False
    grad: bool = False
    lse: bool = False


def tokens_bucket(tokens):
    """The table's token-count bucket of a call: the smallest power of two >= tokens (>= 1)."""
    return 1 << max(0, int(tokens) - 1).bit_length()


def check_table(table, where="table"):
    """The table with its entries checked; ValueError naming the entry and the field."""
    entries = table.get("entries") if isinstance(table, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{where}: expected an object with a list 'entries'")
    for i, entry in enumerate(entries):
        name = f"{where}: entries[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: expected an object")
        extra = set(entry) - set(_ENTRY_KEYS)
        if extra:
            raise ValueError(f"{name}: unknown fields {sorted(extra)}")
        backends = entry.get("backends")
        if not backends or any(b not in BACKENDS for b in backends):
            raise ValueError(f"{name}: 'backends' must be a non-empty list of {BACKENDS}")
        masks = entry.get("mask", [])
        masks = [masks] if isinstance(masks, str) else masks
        if any(m not in MASKS for m in masks):
            raise ValueError(f"{name}: 'mask' must be among {MASKS}, got {entry['mask']!r}")
        if not isinstance(entry.get("device", ""), str):
            raise ValueError(f"{name}: 'device' must be a string")
    return table


_table_cache = {}


def shipped_table():
    """The table the package ships (attention_backends.json), read and checked once."""
    if "table" not in _table_cache:
        with open(TABLE_PATH, encoding="utf-8") as f:
            _table_cache["table"] = check_table(json.load(f), TABLE_PATH.name)
    return _table_cache["table"]


def _matches(entry, call):
    device = entry.get("device")
    if device is not None and not (call.device == device or call.device.startswith(device + ":")):
        return False
    masks = entry.get("mask")
    if masks is not None and call.mask not in ([masks] if isinstance(masks, str) else masks):
        return False
    if "dtype" in entry and entry["dtype"] != call.dtype:
        return False
    if "head_dim" in entry and int(entry["head_dim"]) != call.head_dim:
        return False
    return "tokens_bucket" not in entry or int(entry["tokens_bucket"]) == tokens_bucket(call.tokens)


def _specificity(entry):
    keys = ("device", "dtype", "head_dim", "mask", "tokens_bucket")
    return sum(k in entry for k in keys) + (":" in entry.get("device", ""))


def lookup(table, call):
    """(index, entry) of the table's most specific entry matching the call (the earliest among
    equals), or (None, None). An entry matches when every key it gives equals the call's: device
    ("cuda" matches every CUDA device, "cuda:sm_90" one capability), dtype, head_dim, mask (a
    name or a list) and tokens_bucket (tokens_bucket(call.tokens))."""
    best, best_index = None, None
    for i, entry in enumerate(table["entries"]):
        if _matches(entry, call) and (best is None or _specificity(entry) > _specificity(best)):
            best, best_index = entry, i
    return best_index, best


def _importable(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def available(backend):
    """None when the backend's library is importable, else why not."""
    if backend == "packsched":
        return None
    if backend == "flash_attn":
        return None if _importable("flash_attn") else "flash_attn is not installed"
    module = {
        "varlen_attn": "torch.nn.attention.varlen",
        "flex": "torch.nn.attention.flex_attention",
    }
    return None if _importable(module[backend]) else f"this torch has no {module[backend]}"


def unsupported(backend, call, is_available=None):
    """None when `backend` can run `call`, else the reason it cannot (one line). is_available:
    default `available`."""
    if backend == "packsched":
        return None
    missing = (is_available or available)(backend)
    if missing:
        return missing
    if backend in FLAT_ONLY:
        on_cuda = call.device.split(":")[0] == "cuda"
        problems = [
            (call.mask == "tree", "it takes flat masks only"),
            (not on_cuda, "it runs on CUDA only"),
            (call.dtype not in ("float16", "bfloat16"), f"it takes no {call.dtype}"),
            (call.head_dim > 256, "head dims up to 256 only"),
            (call.seqused or call.tail, "it has no pad slots (seqused) or tail"),
            (call.lse, "its lse is not packsched's layout"),
            (call.softcap and backend == "varlen_attn", "it has no softcap"),
            (call.cross and backend == "varlen_attn", "q and k must have the same layout"),
        ]
    else:  # flex
        problems = [
            (call.device.split(":")[0] not in ("cpu", "cuda"), f"it does not run on {call.device}"),
            (call.cross, "q and k must have the same layout"),
            (call.grad and call.device == "cpu", "torch has no FlexAttention backward on the CPU"),
        ]
    reasons = [why for bad, why in problems if bad]
    return f"{backend}: {reasons[0]}" if reasons else None


def _described(call):
    return (
        f"{call.mask} {call.dtype} D={call.head_dim} on {call.device}, "
        f"{call.tokens} tokens (bucket {tokens_bucket(call.tokens)})"
    )


def choose(call, backend=None, table=None, environ=None, is_available=None):
    """(backend, why) for one call, by the rules of the module docstring. backend: the call's
    argument (None or "auto": not given). table: default the shipped one; environ: default
    os.environ; is_available: default `available`. Raises ValueError for an unknown backend
    name (argument or environment) and for an explicit argument whose backend cannot run the
    call."""
    environ = os.environ if environ is None else environ
    if backend is not None and backend != AUTO:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {(AUTO,) + BACKENDS}, got {backend!r}")
        reason = unsupported(backend, call, is_available)
        if reason:
            raise ValueError(
                f"backend={backend!r} cannot run this call ({_described(call)}): {reason}"
            )
        return backend, f"backend={backend!r} argument"
    wanted = environ.get(ENVIRONMENT, "") or AUTO
    if wanted != AUTO:
        if wanted not in BACKENDS:
            raise ValueError(f"{ENVIRONMENT} must be one of {(AUTO,) + BACKENDS}, got {wanted!r}")
        reason = unsupported(wanted, call, is_available)
        if reason is None:
            return wanted, f"{ENVIRONMENT}={wanted}"
        return "packsched", f"{ENVIRONMENT}={wanted}, but {reason}"
    table = shipped_table() if table is None else table
    index, entry = lookup(table, call)
    if entry is None:
        return "packsched", "no table entry matches"
    source = f"table entry {index}" + (f" ({entry['evidence']})" if "evidence" in entry else "")
    skipped = []
    for name in entry["backends"]:
        reason = unsupported(name, call, is_available)
        if reason is None:
            return name, source + (f"; skipped {'; '.join(skipped)}" if skipped else "")
        skipped.append(reason)
    return "packsched", source + f"; none could run ({'; '.join(skipped)})"


_logged = set()


def log_choice(call, backend, why):
    """Logs the choice at INFO, once per distinct (backend, why, kind of call)."""
    key = (
        backend,
        why,
        call.device,
        call.dtype,
        call.head_dim,
        call.mask,
        tokens_bucket(call.tokens),
    )
    if key not in _logged:
        _logged.add(key)
        logger.info("attention: %s for %s: %s", backend, _described(call), why)
