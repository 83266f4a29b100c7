"""Workers forked from warm templates: they are the broker's children, hold nothing of the
template but its imported code, draw different random numbers, survive their template's
death, are replaced when killed, and their memory is reported."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TritondServer, http_get, serving, socket_inodes, wait_for
from fault_models import add_fault_model

from tritond.check import check
from tritond.workers.template import SPARES


@pytest.fixture(scope="module")
def tserver(tmp_path_factory):
    repo = tmp_path_factory.mktemp("templates") / "models"
    add_fault_model(repo, "pair", count=2, pid_outputs=True, random_output=True)
    add_fault_model(repo, "single", pid_outputs=True)
    with serving(TritondServer(repo)) as s:
        yield s


def infer(server: TritondServer, model: str, outputs=("PID",)) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    x = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    try:
        result = client.infer(model, [x], outputs=[httpclient.InferRequestedOutput(o) for o in outputs])
        return {o: result.as_numpy(o) for o in outputs}
    finally:
        client.close()


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_workers_are_forked_children_of_the_broker_holding_nothing_of_the_template(tserver):
    [broker] = tserver.role_pids("tritond.broker.main")
    [template] = tserver.role_pids("tritond.workers.template")
    assert parent(template) == broker
    workers = tserver.worker_pids()
    assert len(workers) == 3 and all(parent(w) == broker for w in workers)
    template_sockets = socket_inodes(template)
    for w in workers:
        assert not socket_inodes(w) & template_sockets
    # They share the template's pages: each worker's unique memory is a fraction of its RSS.
    with open(f"/proc/{workers[0]}/smaps_rollup") as f:
        fields = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[-1] == "kB"}
    assert fields["Private_Clean"] + fields["Private_Dirty"] < fields["Rss"] / 2


def test_forked_workers_do_not_share_random_streams(tserver):
    draws = {}
    for _ in range(40):
        out = infer(tserver, "pair", ("PID", "RANDOM"))
        draws.setdefault(int(out["PID"][0, 0]), []).append(float(out["RANDOM"][0, 0]))
        if len(draws) == 2 and all(len(v) >= 2 for v in draws.values()):
            break
    assert len(draws) == 2
    a, b = draws.values()
    assert a[:2] != b[:2]


def test_a_killed_forked_worker_is_replaced_and_nothing_is_left_behind(tserver):
    [pid] = tserver.worker_pids("single")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: tserver.worker_pids("single") and tserver.worker_pids("single") != [pid],
             what="a replacement worker of 'single'")
    wait_for(lambda: http_get(f"http://{tserver.http_url}/v2/models/single/ready")[0] == 200,
             what="'single' to be ready again")
    assert int(infer(tserver, "single")["PID"][0, 0]) == tserver.worker_pids("single")[0]
    [broker] = tserver.role_pids("tritond.broker.main")
    assert not os.path.exists(f"/proc/{pid}")            # reaped by the broker, no zombie


def spare_pids(server: TritondServer) -> set[int]:
    out = set()
    for pid in server.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"tritond-spare"):
                    out.add(pid)
        except OSError:
            pass
    return out


def test_a_worker_starts_from_a_spare_forked_ahead(tserver):
    [broker] = tserver.role_pids("tritond.broker.main")
    spares = wait_for(lambda: spare_pids(tserver) if len(spare_pids(tserver)) == SPARES else None,
                      what=f"{SPARES} spares")
    assert all(parent(p) == broker for p in spares)
    [pid] = tserver.worker_pids("single")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: tserver.worker_pids("single") and tserver.worker_pids("single") != [pid],
             what="a replacement worker of 'single'")
    [replacement] = tserver.worker_pids("single")
    assert replacement in spares                    # no fork on the way: a spare took the spec
    assert int(infer(tserver, "single")["PID"][0, 0]) == replacement
    wait_for(lambda: len(spare_pids(tserver)) == SPARES, what="the spare forked again")


def test_the_templates_death_is_survived(tserver):
    [template] = tserver.role_pids("tritond.workers.template")
    os.kill(template, signal.SIGKILL)
    wait_for(lambda: template not in tserver.role_pids("tritond.workers.template"), what="the template to exit")
    wait_for(lambda: not spare_pids(tserver), what="its spares to end with it")
    assert infer(tserver, "pair")["PID"].shape == (1, 1)       # the workers it forked serve on
    [pid] = tserver.worker_pids("single")
    os.kill(pid, signal.SIGKILL)                               # the replacement needs a new template
    wait_for(lambda: tserver.worker_pids("single") and tserver.worker_pids("single") != [pid],
             what="a replacement worker of 'single'")
    wait_for(lambda: http_get(f"http://{tserver.http_url}/v2/models/single/ready")[0] == 200,
             what="'single' to be ready again")
    assert infer(tserver, "single")["PID"].shape == (1, 1)


def test_worker_memory_is_reported_in_metrics(tserver):
    status, body = http_get(f"http://127.0.0.1:{tserver.metrics_port}/metrics")
    assert status == 200
    lines = [line for line in body.decode().splitlines() if line.startswith("tritond_worker_memory_bytes{")]
    uss = [float(line.rsplit(" ", 1)[1]) for line in lines if 'type="uss"' in line]
    pss = [float(line.rsplit(" ", 1)[1]) for line in lines if 'type="pss"' in line]
    assert len(uss) == len(pss) == 3
    assert all(0 < u <= p for u, p in zip(uss, pss))
    assert 'role="template"' in body.decode()


def test_spawning_is_still_there_when_templates_are_off(tmp_path):
    repo = tmp_path / "models"
    add_fault_model(repo, "m", pid_outputs=True)
    with serving(TritondServer(repo, ["--worker-templates=false"], grpc=False)) as s:
        assert s.role_pids("tritond.workers.template") == []
        assert int(infer(s, "m")["PID"][0, 0]) == s.worker_pids("m")[0]


def test_check_memory_estimates_a_repository(tmp_path, capsys):
    repo = tmp_path / "models"
    add_fault_model(repo, "three", count=3)
    assert check([str(repo)], memory=True) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["three"])
    assert row.split()[1:3] == ["python", "3"]
    assert float(row.split()[-1]) > 0
    assert "templates (one framework import per kind: python)" in out and "total, workers and templates" in out
