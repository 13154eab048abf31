"""Checkpoints in object storage: ``checkpoint_dir`` an fsspec URL (``memory://``, and ``s3://`` against a real
S3-compatible server started here on 127.0.0.1: moto's). A checkpoint is published by its marker, written last with
each file's checksum; one without it is absent; retention never removes the newest; the store gone mid-upload (a
relay cut, the server killed), an unreachable endpoint, a missing or read-only bucket and missing credentials are
clear errors, nothing published incomplete. ``file://`` is a local folder. Skipped without fsspec (s3fs and moto for
the S3 cases)."""

import contextlib
import hashlib
import json
import socket
import sys
import threading
import time
import warnings

import pytest
import run_script
import torch
from helpers import assert_states_equal
from processes import S3Server, free_port

import composetrain as ct
import composetrain.checkpoint.objects as objects
from composetrain.checkpoint.background import LOG
from composetrain.checkpoint.objects import ObjectCheckpoints, is_remote, local_path, open_checkpoints
from composetrain.driver.options import RunOptions

fsspec = pytest.importorskip("fsspec")

OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 4, "checkpoint_async": True}


def train(directory, step=run_script.step, state=None, **options):
    state = run_script.state() if state is None else state
    result = ct.run(step, state, run_script.dataset(), checkpoint_dir=directory, **{**OPTIONS, **options})
    return state, result


def listing(url):
    """Every object under ``url`` (relative), fresh from the store."""
    fs, path = objects.filesystem(url)
    return sorted(p[len(path) + 1 :] for p in fs.find(path))


def published(url):
    names = [name.split("/")[0] for name in listing(url) if name.endswith("/checksums.json")]
    return sorted(n for n in names if n.startswith("step-"))


def latest(url):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to skip
        checkpoints = open_checkpoints(url, rank=0, world_size=1, keep=2)
        found = checkpoints.latest()
        checkpoints.close()
    return None if found is None else found[0].name


def test_urls_name_object_storage_and_file_urls_local_folders(tmp_path):
    assert is_remote("s3://bucket/runs/a") and is_remote("memory://a") and is_remote("gs://b/c")
    assert not is_remote("runs/a") and not is_remote(tmp_path) and not is_remote(f"file://{tmp_path}")
    assert local_path(f"file://{tmp_path}/a%20b") == f"{tmp_path}/a b" and local_path("runs/a") == "runs/a"
    data = run_script.dataset()
    args = {name: None for name in ("epochs", "max_steps", "shuffle", "drop_last", "global_batch_size", "eval_step")}
    args.update(num_workers=0, collate_fn=None, eval_data=None, eval_every=None, log_every=1, progress=False)
    args.update(checkpoint_every=None, keep_checkpoints=2, seed=0, requeue=True, timeout=10.0, tensorboard=False)
    remote = RunOptions.from_run_args(data, batch_size=4, log_file=None, checkpoint_dir="s3://b/run", **args)
    assert remote.log.log_file is None  # no metrics file in object storage unless log_file gives one
    local = RunOptions.from_run_args(data, batch_size=4, log_file=None, checkpoint_dir=f"file://{tmp_path}", **args)
    assert local.log.log_file == tmp_path / "metrics.jsonl"


def test_a_file_url_is_a_local_folder_saved_by_rename(tmp_path):
    _, result = train(f"file://{tmp_path}", max_steps=4, checkpoint_every=2)
    assert result.checkpoint == tmp_path / "step-000000004" and (tmp_path / ".lock-rank-0").exists()
    assert (tmp_path / "metrics.jsonl").stat().st_size > 0


def test_a_run_in_memory_storage_saves_and_resumes_as_one_in_a_folder(tmp_path):
    straight, _ = train(tmp_path, max_steps=10, checkpoint_every=3)
    train("memory://runs/a", max_steps=7, checkpoint_every=3)
    assert listing("memory://runs/a") == [
        f"step-00000000{n}/{name}" for n in (6, 7) for name in ("checksums.json", "rank-0.pt", "state.pt")
    ]
    resumed, result = train("memory://runs/a", max_steps=10, checkpoint_every=3)
    assert_states_equal(resumed, straight)
    assert result.checkpoint == "memory://runs/a/step-000000010"
    loaded = run_script.state()
    ct.load_checkpoint(loaded, result.checkpoint)
    assert_states_equal(loaded, straight)


def test_without_fsspec_object_storage_is_refused_saying_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    state = run_script.state()
    with pytest.raises(ImportError, match=r"needs fsspec .*pip install 'composetrain\[s3\]'"):
        train("memory://runs/none", state=state, max_steps=2)
    assert state.step == 0


class Killed(BaseException):
    """A process killed there: nothing after it runs (no clean-up), unlike an error."""


@pytest.mark.parametrize("stop", [Killed, OSError])
def test_a_step_saved_again_replaces_the_published_one_without_ever_leaving_none(monkeypatch, stop):
    """Checkpoint 3 saved, then saved again with other contents (as after a skipped update): stopped at each I/O
    step of the second save (killed: no clean-up; or failing: the save cleans up and raises), the next run finds a
    complete step 3, the old or the new, and once the new is put in place only the new."""

    train("memory://resave/run", max_steps=3)
    first = ObjectCheckpoints("memory://resave/run", 0, 1, 2)
    _, shared, local = first.latest()
    first.close()
    shared = {k: v for k, v in shared.items() if k not in ("format", "world_size")}  # stamped again by the save

    def payload(n):
        return {**shared, "n": n}, local

    def save_twice(url, stop_at=None):
        seen = []

        def step(what):
            seen.append(what)
            if len(seen) == stop_at:
                raise stop(what)

        checkpoints = ObjectCheckpoints(url, 0, 1, 2)
        checkpoints.save(3, *payload(1))
        monkeypatch.setattr(objects, "io_step", step)
        try:
            checkpoints.save(3, *payload(2))
        finally:
            monkeypatch.undo()
        return seen

    steps = save_twice("memory://resave/straight")
    assert steps[0].startswith("prepare .step-000000003.tmp") and "upload .step-000000003.tmp/checksums.json" in steps
    for k in range(1, len(steps) + 1):
        url = f"memory://resave/{stop.__name__}{k}"
        with pytest.raises(stop):
            save_twice(url, stop_at=k)
        again = ObjectCheckpoints(url, 0, 1, 2)  # the next run: finishes a replacement cut short
        found = again.latest()
        again.close()
        assert found is not None and found[0].name == "step-000000003", f"stopped at {steps[k - 1]}"
        assert found[1]["n"] in (1, 2) and (
            found[1]["n"] == 2 or k <= steps.index("remove step-000000003/checksums.json") + 1
        )
        assert not [n for n in listing(url) if n.startswith(".step-")], f"stopped at {steps[k - 1]}"


# -- S3, against moto's server ---------------------------------------------------------------------------------


def test_a_run_in_s3_saves_in_the_background_publishes_by_a_marker_written_last_and_resumes(s3, tmp_path, monkeypatch):
    url = s3.bucket("runs") + "/exp"
    monkeypatch.setenv(LOG, str(tmp_path / "steps.log"))
    train(url, max_steps=7, checkpoint_every=3)
    monkeypatch.delenv(LOG)
    steps = [line.split(" ", 1)[1] for line in (tmp_path / "steps.log").read_text().splitlines()]
    for n in (3, 6, 7):
        name = f"step-00000000{n}"
        marker = steps.index(f"upload {name}/checksums.json [MainThread]")
        uploads = [i for i, s in enumerate(steps) if s.startswith("upload ") and s.endswith(f"[checkpoint step {n}]")]
        if n < 7:  # 3 and 6 in the background, each file uploaded before the marker
            assert len(uploads) == 2 and max(uploads) < marker, steps
    assert listing(url) == [
        f"{s}/{f}" for s in ("step-000000006", "step-000000007") for f in ("checksums.json", "rank-0.pt", "state.pt")
    ]
    fs, path = objects.filesystem(url)
    sums = json.loads(fs.cat_file(f"{path}/step-000000007/checksums.json"))["sha256"]
    for name, digest in sums.items():
        assert hashlib.sha256(fs.cat_file(f"{path}/step-000000007/{name}")).hexdigest() == digest
    straight, _ = train(tmp_path / "straight", max_steps=10, checkpoint_every=3)
    resumed, result = train(url, max_steps=10, checkpoint_every=3)
    assert_states_equal(resumed, straight) and result.checkpoint == f"{url}/step-000000010"


def test_a_checkpoint_without_its_marker_is_absent_and_a_changed_object_is_set_aside(s3, tmp_path):
    url = s3.bucket("markers") + "/exp"
    train(url, max_steps=9, checkpoint_every=3, keep_checkpoints=3)  # 6, 8 (the epoch's end), 9 kept
    client = s3.client()
    client.delete_object(Bucket="markers", Key="exp/step-000000009/checksums.json")  # as if cut short
    assert latest(url) == "step-000000008"
    client.put_object(Bucket="markers", Key="exp/step-000000008/state.pt", Body=b"changed")
    with pytest.warns(
        UserWarning,
        match=r"skipping unreadable checkpoint s3://markers/exp/step-000000008: state\.pt "
        r"does not match the checksum .* moved to corrupt-step-000000008",
    ):
        resumed, _ = train(url, max_steps=12, checkpoint_every=3, keep_checkpoints=3)
    straight, _ = train(tmp_path / "straight", max_steps=12, checkpoint_every=3)
    assert_states_equal(resumed, straight)
    names = listing(url)
    assert "corrupt-step-000000008/checksums.json" in names and "corrupt-step-000000008/state.pt" in names
    assert published(url) == ["step-000000008", "step-000000009", "step-000000012"]  # resumed from 6, saved anew


def test_an_upload_of_several_ranks_cut_short_with_their_marks_is_tidied_by_the_next_run(s3, tmp_path):
    """A two-rank save cut short leaves, under its prefix, a rank's file and that rank's mark (its checksums, which
    a failing run's rank 0 reads to publish alone), no marker: the next run removes them as its own objects, saves
    there anew and ends as the uninterrupted run."""
    url = s3.bucket("marks") + "/exp"
    train(url, max_steps=4, checkpoint_every=4)
    client = s3.client()
    client.put_object(Bucket="marks", Key="exp/step-000000008/.written-rank-1", Body=b'{"sha256": {}}')
    client.put_object(Bucket="marks", Key="exp/step-000000008/rank-1.pt", Body=b"half")
    resumed, _ = train(url, max_steps=12, checkpoint_every=4)
    straight, _ = train(tmp_path / "straight", max_steps=12, checkpoint_every=4)
    assert_states_equal(resumed, straight)
    assert [n for n in listing(url) if n.startswith("step-000000008/")] == [
        f"step-000000008/{f}" for f in ("checksums.json", "rank-0.pt", "state.pt")
    ]


def test_retention_in_s3_keeps_the_newest_complete_checkpoint_at_every_moment(s3):
    url = s3.bucket("retention") + "/exp"
    looks = []

    def step(model, batch):
        looks.append(published(url))
        return run_script.step(model, batch)

    train(url, step, max_steps=6, checkpoint_every=1, keep_checkpoints=1)
    assert all(names for names in looks[2:]), looks  # once the first is published, never none
    assert published(url) == ["step-000000006"] and listing(url) == [
        f"step-000000006/{f}" for f in ("checksums.json", "rank-0.pt", "state.pt")
    ]


class Relay:
    """A TCP relay from 127.0.0.1:``port`` to the server. ``cut(after)``: once ``after`` more bytes went towards the
    server, every connection is dropped and new ones are closed at once (the server gone, as its clients see it),
    until ``restore()``."""

    def __init__(self, target: int) -> None:
        self.target, self.budget, self.down, self.lock = target, None, False, threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port, self.open = self.listener.getsockname()[1], []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            server = socket.create_connection(("127.0.0.1", self.target))
            self.open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source, sink, upstream):
        try:
            while data := source.recv(1 << 16):
                with self.lock:
                    if upstream and self.budget is not None:
                        self.budget -= len(data)
                        if self.budget <= 0:
                            self._drop()
                            return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.close()

    def _drop(self):
        self.down = True
        for s in self.open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.open = []

    def cut(self, after: int) -> None:
        with self.lock:
            self.budget = after

    def restore(self) -> None:
        with self.lock:
            self.budget, self.down = None, False

    def close(self) -> None:
        self.listener.close()
        self._drop()


def big_state():
    """run_script's state with an 8 MB buffer: state.pt is uploaded in parts (s3fs: 5 MB each)."""
    state = run_script.state()
    state.model.register_buffer("ballast", torch.randn(1 << 20, dtype=torch.float64, generator=torch.Generator()))
    return state


def cutting(at, action):
    """objects.io_step, doing ``action()`` when the background upload of state.pt for step ``at`` begins."""
    real = objects.io_step

    def step(what):
        if what == "upload state.pt" and threading.current_thread().name == f"checkpoint step {at}":
            action()
        real(what)

    return step


def test_the_store_gone_mid_upload_stops_the_run_and_publishes_nothing(s3, tmp_path, monkeypatch):
    """The relay to the server is cut 1 MB into the background upload of step 6's state.pt (8 MB): the run stops
    with an error saying so, step 3 stays the newest; with the relay back, the run resumes from 3 and ends as the
    uninterrupted run."""
    url = s3.bucket("midway") + "/exp"
    relay = Relay(s3.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{relay.port}")
    monkeypatch.setattr(objects, "io_step", cutting(6, lambda: relay.cut(1 << 20)))
    started = time.monotonic()
    with pytest.raises(OSError) as raised:
        train(url, state=big_state(), max_steps=9, checkpoint_every=3)
    message = str(raised.value)
    assert message.startswith(f"run: checkpoint step 6 could not be written in {url} (the upload of {url}/step-"), (
        message
    )
    assert "the storage cannot be reached" in message or "failed:" in message, message
    assert message.endswith(
        "the previous checkpoint step-000000003 is intact and nothing of step 6 was published "
        "(what was uploaded of it has no marker: it is absent)"
    ), message
    assert time.monotonic() - started < 240
    relay.restore()
    assert latest(url) == "step-000000003" and "step-000000006/checksums.json" not in listing(url)
    monkeypatch.undo()
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    resumed, _ = train(url, state=big_state(), max_steps=9, checkpoint_every=3)
    straight, _ = train(tmp_path / "straight", state=big_state(), max_steps=9, checkpoint_every=3)
    assert_states_equal(resumed, straight)
    relay.close()


def test_the_server_killed_mid_upload_is_a_clear_error_within_seconds(s3_server, tmp_path, monkeypatch):
    server = S3Server()  # a server of its own, to kill
    try:
        for name, value in {**s3_server.env, "AWS_ENDPOINT_URL": server.url}.items():
            monkeypatch.setenv(name, value)
        url = server.bucket("killed") + "/exp"
        killed = []

        def kill():
            killed.append(time.monotonic())
            threading.Timer(0.05, server.kill).start()  # while the parts of state.pt go up

        monkeypatch.setattr(objects, "io_step", cutting(6, kill))
        with pytest.raises(
            OSError,
            match=r"run: checkpoint step 6 could not be written in s3://killed/exp "
            r"\(the upload of .*\); the previous checkpoint step-000000003 is intact",
        ):
            train(url, state=big_state(), max_steps=60, checkpoint_every=3)
        assert killed and time.monotonic() - killed[0] < 120
    finally:
        server.close()


@pytest.mark.parametrize("case", ["unreachable", "no bucket", "no credentials"])
def test_a_store_that_cannot_be_written_is_refused_before_anything_is_trained(s3, monkeypatch, case):
    url, error, says = "s3://runs/exp", ConnectionError, "the storage cannot be reached"
    if case == "unreachable":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    elif case == "no bucket":
        url, error, says = "s3://no-such-bucket/exp", FileNotFoundError, "not found (FileNotFoundError: The specified "
    else:
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        error, says = PermissionError, "no credentials (NoCredentialsError: Unable to locate credentials)"
    calls, state = [], run_script.state()

    def step(model, batch):
        calls.append(1)
        return run_script.step(model, batch)

    with pytest.raises(error) as raised:
        train(url, step, state=state, max_steps=3)
    message = str(raised.value)
    assert message.startswith(f"run: checkpoint_dir '{url}' cannot be used: the write of {url}/.write-test-"), message
    assert says in message and message.endswith("; nothing was trained or saved"), message
    assert not calls and state.step == 0


def test_a_read_only_bucket_is_refused_before_anything_is_trained(s3_server, monkeypatch):
    """A server that checks credentials against IAM policies (after its first 4 requests, which set it up): this
    run's user may get and list, not put."""
    server = S3Server(INITIAL_NO_AUTH_ACTION_COUNT="4")
    try:
        server.bucket("readonly")
        iam = server.client("iam")
        iam.create_user(UserName="reader")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:Get*", "s3:List*"], "Resource": "*"}],
        }
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        env = {**s3_server.env, "AWS_ENDPOINT_URL": server.url, "AWS_ACCESS_KEY_ID": key["AccessKeyId"]}
        for name, value in {**env, "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}.items():
            monkeypatch.setenv(name, value)
        state = run_script.state()
        refused = (
            r"^run: checkpoint_dir 's3://readonly/exp' cannot be used: the write of .* failed: access denied "
            r"\(PermissionError: Access Denied\): these credentials may not"
        )
        with pytest.raises(PermissionError, match=refused):
            train("s3://readonly/exp", state=state, max_steps=3)
        assert state.step == 0
    finally:
        server.close()


def test_two_ranks_save_into_one_checkpoint_in_s3_and_sharded_states_are_refused(pool, s3, tmp_path):
    url = s3.bucket("ranks") + "/exp"
    a, b = pool.run(__name__, "two_ranks", url, s3.env)
    assert a == b == {"steps": 6, "checkpoint": f"{url}/step-000000006"}
    assert listing(url) == [
        f"step-00000000{n}/{f}" for n in (4, 6) for f in ("checksums.json", "rank-0.pt", "rank-1.pt", "state.pt")
    ]
    resumed = pool.run(__name__, "two_ranks", url, s3.env, 8)
    straight = pool.run(__name__, "two_ranks", str(tmp_path / "straight"), s3.env, 8)
    assert resumed[0]["params"] == straight[0]["params"]
    refusals = pool.run(__name__, "sharded_refused", url + "-sharded", s3.env)
    assert all(
        r.startswith(
            "ValueError: run: checkpoint_dir 's3://ranks/exp-sharded' is object storage, where "
            "ct.run does not save sharded tensors"
        )
        for r in refusals
    ), refusals
    assert all(r.endswith("(0 updates)") for r in refusals), refusals  # before training, not at the first save


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------


def with_env(env, call):
    import os

    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        return call()
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def two_ranks(rank, world, url, env, steps=6):
    state = run_script.state()
    step = ct.distributed(run_script.step)
    result = with_env(
        env,
        lambda: ct.run(
            step, state, run_script.dataset(), checkpoint_dir=url, max_steps=steps, checkpoint_every=2, **OPTIONS
        ),
    )
    if steps != 6:
        return {"params": [p.tolist() for p in state.model.parameters()]}
    return {"steps": result.steps, "checkpoint": result.checkpoint}


def sharded_refused(rank, world, url, env):
    state, calls = run_script.state(), []

    def step(model, batch):
        calls.append(1)
        return run_script.step(model, batch)

    try:
        with_env(
            env,
            lambda: ct.run(ct.sharded(step), state, run_script.dataset(), checkpoint_dir=url, max_steps=2, **OPTIONS),
        )
    except ValueError as e:
        return f"ValueError: {e} ({len(calls)} updates)"
    return "no error"
