"""``bench kubewire``: CPU to decode a Pod watch event, Kubernetes protobuf against JSON.

The events are kube-apiserver v1.37's own (``tests/fixtures/kube-protobuf/pods-watch.{pb,json}``:
the same watch recorded in both encodings by ``python -m scripts.realkube.record_protobuf``).
Per round, alternating which goes first, each event is decoded ``--reps`` times:

* ``json``: :func:`~bigfleet_trio.kube.watch.decode_watch_line` (orjson), what the informer
  did before protobuf and still does for CRs;
* ``protobuf``: :func:`~bigfleet_trio.kube.protowire.decode_watch_frame` (upb, the schema's
  fields only) plus the :class:`WatchEvent`, what the informer does now for Pods and Nodes.

* ``heartbeat``: a MODIFIED Pod event the informer skips as unchanged
  (:func:`~bigfleet_trio.kube.protowire.decode_watch_frame_unless`: only the head is built,
  docs/kube-api.md#unchanged-pod-events), against JSON's decode + the same check, which must
  decode the whole event first; and against the path without the check (decode, project,
  compare the projections: what the informer and ``_on_pod_update`` do for such an event).

Figures: µs of process CPU per event decoded, and decoded + projected (``slim_pod``, what the
informer stores), protobuf against JSON in the same run (target: decode <= 1/3); bytes per
cached projection (tracemalloc; target: not above JSON's) and per event on the wire.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from scripts.bench import _common as C

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "kube-protobuf"


def _events() -> tuple[list[bytes], list[bytes]]:
    """The recorded watch's JSON lines and protobuf frames (the same events)."""
    from bigfleet_trio.kube import protowire

    lines = [ln for ln in (FIXTURES / "pods-watch.json").read_bytes().split(b"\n") if ln]
    frames = protowire.split_frames(bytearray((FIXTURES / "pods-watch.pb").read_bytes()))
    if len(lines) != len(frames):
        raise SystemExit(f"fixtures disagree: {len(lines)} JSON events, {len(frames)} frames")
    return lines, frames


def _per_event_us(decode: Any, items: list[bytes], reps: int) -> float:
    start = time.process_time()
    for _ in range(reps):
        for item in items:
            decode(item)
    return (time.process_time() - start) / (reps * len(items)) * 1e6


def _cached_bytes_per_pod(project: Any, items: list[bytes], copies: int) -> float:
    """tracemalloc growth per cached projection: every event decoded and projected ``copies``
    times, all kept (as the informer's store keeps them)."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [project(item) for _ in range(copies) for item in items]
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return grown / len(kept)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bigfleet_trio.kube import protowire
    from bigfleet_trio.kube.watch import WatchEvent, decode_watch_line
    from bigfleet_trio.podcontroller.projections import pod_unchanged, slim_pod

    lines, frames = _events()

    def pb_event(frame: bytes) -> WatchEvent:
        etype, obj = protowire.decode_watch_frame(frame)
        return WatchEvent(etype, obj)  # type: ignore[arg-type]

    def json_slim(line: bytes) -> Any:
        ev = decode_watch_line(line)
        assert ev is not None
        return slim_pod(ev.object)

    def pb_slim(frame: bytes) -> Any:
        return slim_pod(pb_event(frame).object)

    # the cache each heartbeat is checked against: the event's own projection (so every
    # event is found unchanged, as a running Pod's status writes are)
    def version(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["metadata"]["uid"], obj["metadata"]["resourceVersion"]

    decoded = [protowire.decode_watch_frame(f)[1] for f in frames]
    cached = {version(obj): slim_pod(obj) for obj in decoded}

    def skip(obj: dict[str, Any]) -> bool:
        return pod_unchanged(cached[version(obj)], obj)

    def pb_heartbeat(frame: bytes) -> WatchEvent:
        etype, obj, verdict = protowire.decode_watch_frame_unless(frame, skip)
        if verdict is False:
            raise SystemExit("a recorded event was not found unchanged against itself")
        return WatchEvent(etype, obj, verdict)  # type: ignore[arg-type]

    def pb_unfiltered(frame: bytes) -> bool:  # the informer's path without the check
        obj = pb_event(frame).object
        return slim_pod(obj) == cached[version(obj)]

    def json_heartbeat(line: bytes) -> bool:
        ev = decode_watch_line(line)
        assert ev is not None
        return skip(ev.object)

    reps = 200 if args.quick else args.reps
    rounds = 1 if args.quick else args.rounds
    keys = ("json", "pb", "json_slim", "pb_slim", "json_heartbeat", "pb_heartbeat",
            "pb_unfiltered")
    got: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        order = ("json", "pb") if r % 2 == 0 else ("pb", "json")
        for who in order:
            items = lines if who == "json" else frames
            got[who].append(_per_event_us(decode_watch_line if who == "json" else pb_event,
                                          items, reps))
            got[f"{who}_slim"].append(_per_event_us(json_slim if who == "json" else pb_slim,
                                                    items, reps))
            got[f"{who}_heartbeat"].append(_per_event_us(
                json_heartbeat if who == "json" else pb_heartbeat, items, reps))
            if who == "pb":
                got["pb_unfiltered"].append(_per_event_us(pb_unfiltered, items, reps))
    copies = 100 if args.quick else 1000
    cached = {"json": _cached_bytes_per_pod(json_slim, lines, copies),
              "pb": _cached_bytes_per_pod(pb_slim, frames, copies)}
    sizes = {"json_bytes_per_event": sum(map(len, lines)) / len(lines),
             "protobuf_bytes_per_event": sum(map(len, frames)) / len(frames)}
    label = "JSON (orjson) of the same events, same run"
    figs = [
        C.figure("decode one Pod watch event, protobuf (upb, schema fields)", "µs CPU",
                 got["pb"], baseline=got["json"], baseline_label=label,
                 target="<= 1/3 of JSON", met=lambda _m, ratio: ratio is not None
                 and ratio <= 1 / 3),
        C.figure("a status heartbeat (MODIFIED, unchanged): protobuf head + check", "µs CPU",
                 got["pb_heartbeat"], baseline=got["json_heartbeat"],
                 baseline_label="JSON decode + the same check, same run",
                 target="<= 1/3 of JSON", met=lambda _m, ratio: ratio is not None
                 and ratio <= 1 / 3),
        C.figure("a status heartbeat, protobuf: head + check, against the path without it",
                 "µs CPU", got["pb_heartbeat"], baseline=got["pb_unfiltered"],
                 baseline_label="protobuf decode + slim_pod + compare with the cache, same run"),
        C.figure("decode + slim_pod one Pod watch event, protobuf", "µs CPU", got["pb_slim"],
                 baseline=got["json_slim"], baseline_label=label),
        C.figure("cached bytes per Pod (slim_pod, tracemalloc), from protobuf", "B",
                 cached["pb"], baseline=cached["json"], baseline_label="from JSON",
                 target="not above JSON", met=lambda _m, ratio: ratio is not None
                 and ratio <= 1.0),
        C.figure("bytes per Pod watch event, protobuf", "B",
                 sizes["protobuf_bytes_per_event"], baseline=sizes["json_bytes_per_event"],
                 baseline_label="JSON"),
    ]
    return C.result("kubewire", {"events": len(lines), "reps": reps, "rounds": rounds}, figs,
                    [], {"samples": got, **sizes})


def register(sub: Any) -> None:
    p = sub.add_parser("kubewire", parents=[sub.common], help=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2000, help="decodes of each event per round")
    p.add_argument("--rounds", type=int, default=5)
    p.set_defaults(func=run)
