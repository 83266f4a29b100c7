"""A frontend's view of several brokers: one table merged from theirs, each request sent to its
model's broker, and a reply released where it came from (request ids carry the broker)."""
from __future__ import annotations

from tritond.frontend.broker_client import ModelTable
from tritond.frontend.brokers import Brokers
from tritond.wire import schema as S


def entry(name: str) -> S.ModelEntry:
    return S.ModelEntry(name, 1, S.ModelState.READY)


def table(names: list[str], started: bool = True) -> S.Table:
    return S.Table(1, [entry(n) for n in names], names, started)


def arrive(brokers: Brokers, k: int, t: S.Table) -> None:
    brokers.clients[k].table = ModelTable(t)
    brokers.clients[k].on_table()


def test_tables_merge_and_route_by_model(tmp_path):
    brokers = Brokers(str(tmp_path), "http", 3)
    arrive(brokers, 0, table(["a"]))
    arrive(brokers, 2, table(["c", "d"]))
    assert not brokers.table.ready(strict=False)        # broker 1 has not said anything yet
    arrive(brokers, 1, table(["b"]))
    assert brokers.table.ready(strict=True)
    assert brokers.route == {"a": 0, "b": 1, "c": 2, "d": 2}
    assert brokers.table.resolve("d").name == "d"
    for model, k in (("a", 0), ("b", 1), ("c", 2), ("unknown", 0)):
        rid = brokers.next_id(model)
        assert brokers._client(rid) is brokers.clients[k]


def test_a_broker_restarting_keeps_its_models_routed(tmp_path):
    brokers = Brokers(str(tmp_path), "http", 2)
    arrive(brokers, 0, table(["a"]))
    arrive(brokers, 1, table(["b"]))
    brokers.clients[1].table = ModelTable()         # silent: its watchdog dropped the table
    assert brokers.route["b"] == 1
    arrive(brokers, 1, table(["b"], started=False))
    assert not brokers.table.ready(strict=False)


def test_trace_done_goes_to_the_broker_that_traces(tmp_path):
    brokers = Brokers(str(tmp_path), "http", 2)
    sent: list[tuple[int, S.TraceDone]] = []
    for k, client in enumerate(brokers.clients):
        client.send_quietly = lambda msg, k=k: sent.append((k, msg))
    brokers.send_quietly(S.TraceDone(5))
    brokers.send_quietly(S.TraceDone((1 << S.TRACE_SHARD_SHIFT) + 5))
    assert [k for k, _ in sent] == [0, 1]
