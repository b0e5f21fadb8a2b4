"""Named, deterministic fault schedules: one per finding of issue 9, each on a fresh local cluster,
but for findings 3, 4 and 7: they fault no replica and use topics of their own, so they share one
cluster of the default configuration (a cluster start is seconds of CPU), in that order, last in the
module, as finding 7 stops and restarts its redis-server.

Each schedule drives real processes (kill -9, SIGSTOP/SIGCONT, redis-server stop/start) into the
situation a finding describes and then checks the invariant the finding broke (docs/design/invariants.md),
through the history checker where the invariant is about acknowledged records and low watermarks.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import grpc
import pytest

from lowtide.client import Consumer
from lowtide.client.replica import ReplicaClient
from lowtide.errors import LowtideError
from lowtide.localcluster.kinds import REPLICA_MODULE, supported_flags
from lowtide.messages.replica import FetchPosition
from lowtide.record import crc32c, decode_batches, encode_batch
from lowtide.rpc.channels import CHANNEL_OPTIONS
from lowtide_pb import replica_pb2, replica_pb2_grpc
from tests.chaos.checker import History, ReadObs, check, decode_id, encode_value
from tests.chaos.harness import (
    LAG_TIME_MS,
    SESSION_TIMEOUT_MS,
    ChaosEnv,
    SoftChecks,
    cluster_json,
    fmt_violations,
    ids_for,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

AUTH_FAILURES = {"SASL_AUTHENTICATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED"}


def produce_batches(env: ChaosEnv, history: History, topic: str, batches: int, per_batch: int = 10,
                    partition: int = 0, prefix: str | None = None) -> int:
    """acks=all batches of fresh ids; returns the offset after the last acknowledged one."""
    end = 0
    for b in range(batches):
        ids = ids_for(prefix or topic, b * per_batch, per_batch)
        end = env.produce_acked(topic, partition, ids, history=history) + per_batch
    return end


def create_topic_retrying(env: ChaosEnv, topic: str) -> None:
    """Create a topic, retrying while credentials propagate (an earlier try may have created it)."""
    def attempt() -> bool:
        try:
            env.create_topic(topic)
        except LowtideError as exc:
            if exc.name != "TOPIC_ALREADY_EXISTS":
                raise
        return env.leader(topic) >= 0

    wait_until(attempt, timeout_s=20, what=f"topic {topic} created")


def others(replicas: tuple[int, ...], leader: int) -> tuple[int, int]:
    """(F, G): the followers in assignment order. The controller elects the first replica of the
    assignment that is in the ISR and live, so F is who replaces the leader when both are eligible."""
    rest = [r for r in replicas if r != leader]
    return rest[0], rest[1]


# ---------------------------------------------------------------------------------- finding 1


def test_stale_hw_truncation_loses_no_acknowledged_record(chaos_cluster):
    # The periodic HW checkpoint is pushed out of reach, so a restarted replica's checkpointed HW is
    # far behind its log: the old code truncated a restarted follower to that HW.
    cluster, env = chaos_cluster(replica_config={"log.checkpoint.interval.ms": "600000"})
    history = History()
    env.create_topic("s1")
    st = env.state("s1")
    leader = st.leader
    f, _g = others(st.replicas, leader)
    end = produce_batches(env, history, "s1", batches=40)
    wait_until(lambda: env.describe(f, "s1").log_end_offset == end and env.describe(leader, "s1").high_watermark == end,
               what=f"replica {f} holding all {end} acknowledged records")

    # Freeze the controller so that the election happens once F is back (and L's session is gone).
    cluster.pause("frontdoor-0")
    try:
        cluster.pause(f"replica-{leader}")
        cluster.kill(f"replica-{f}")
        cluster.start_service(f"replica-{f}")  # truncates on restart; L is stopped, so it cannot refetch
        env.forget(f)
        wait_until(lambda: leader not in env.live_brokers(), timeout_s=15,
                   what=f"the session of the stopped leader {leader} to expire")
    finally:
        cluster.resume("frontdoor-0")
    new_leader = -1

    def elected() -> bool:
        nonlocal new_leader
        new_leader = env.leader("s1")
        return new_leader not in (leader, -1)

    wait_until(elected, timeout_s=15, what="a new leader of s1-0")
    cluster.resume(f"replica-{leader}")
    final = env.final_read(history, "s1", 0, timeout_s=15)
    violations = check(history)
    assert not violations, (
        f"leader {leader} stopped, follower {f} killed and restarted, replica {new_leader} elected "
        f"(F={'yes' if new_leader == f else 'no'}); {end} records were acknowledged, the final read from the "
        f"new leader has {len(final.records)} in [{final.log_start_offset}, {final.high_watermark}):\n"
        f"{fmt_violations(violations)}")


# ---------------------------------------------------------------------------------- finding 2


def test_acknowledged_delete_is_never_undone(chaos_cluster):
    # A 10 s ISR lag limit against a 3 s session timeout leaves a window in which the killed follower
    # is no longer live but still in the ISR: where the old LW (over live replicas) and the election
    # (ISR ∩ live) disagreed. A short checkpoint interval keeps finding 1 out of the picture.
    cluster, env = chaos_cluster(replica_config={"replica.lag.time.max.ms": "10000",
                                                 "log.checkpoint.interval.ms": "300"})
    history = History()
    env.create_topic("s2")
    st = env.state("s2")
    leader = st.leader
    f, g = others(st.replicas, leader)
    end = produce_batches(env, history, "s2", batches=30)
    wait_until(lambda: env.describe(f, "s2").high_watermark == end, what=f"replica {f} caught up")
    time.sleep(0.6)  # two HW checkpoints

    cluster.kill(f"replica-{f}")
    wait_until(lambda: f not in env.live_brokers(), timeout_s=15, what=f"the session of killed replica {f} to expire")
    target = 200
    lw = -1
    deadline = time.monotonic() + 30
    last: LowtideError | None = None
    while lw < 0 and time.monotonic() < deadline:  # the call may wait (or time out) while F counts
        started = history.delete_started("s2", 0, target)
        try:
            res = env.admin.delete_records({("s2", 0): target}, timeout_ms=20_000)[("s2", 0)]
            if res.error is None:
                lw = res.low_watermark
                history.delete_acked("s2", 0, target, lw, started=started)
            else:
                last = res.error
        except LowtideError as err:
            last = err
        if lw < 0 and last is not None and not last.retriable:
            break
    assert lw >= target, f"harness: DeleteRecords(s2-0 before {target}) was never acknowledged: {last!r}"

    leaders_seen: list[int] = []
    probes = 0
    try:
        cluster.pause(f"replica-{leader}")
        cluster.pause(f"replica-{g}")
        cluster.start_service(f"replica-{f}")
        env.forget(f)
        probe_until = time.monotonic() + 2 * SESSION_TIMEOUT_MS / 1000 + 4
        while time.monotonic() < probe_until:
            probes += 1
            st = env.state("s2")
            if not leaders_seen or leaders_seen[-1] != st.leader:
                leaders_seen.append(st.leader)
            if st.leader in (leader, g, -1):
                time.sleep(0.2)
                continue
            for offset in (0, lw - 1):  # below the acknowledged low watermark
                started = history.now()
                try:
                    [r] = env.replicas.fetch(env.address(st.leader), [FetchPosition(
                        topic="s2", partition=0, fetch_offset=offset, current_leader_epoch=st.leader_epoch)],
                        max_wait_ms=0, deadline_s=3)
                except LowtideError:
                    continue
                records = tuple((rec.offset, decode_id(rec.value)) for _h, recs in decode_batches(r.records)
                                for rec in recs if rec.offset >= offset)
                history.read(ReadObs("s2", 0, started, history.now(), fetch_offset=offset, records=records,
                                     log_start_offset=r.log_start_offset, high_watermark=r.high_watermark,
                                     source=f"fetch from replica {st.leader}"))
            started = history.now()
            try:
                answer = env.admin.list_offsets({("s2", 0): -2})[("s2", 0)]
                if answer.error is None:
                    history.read(ReadObs("s2", 0, started, history.now(), log_start_offset=answer.offset,
                                         source="ListOffsets earliest"))
            except LowtideError:
                pass
            time.sleep(0.2)
    finally:
        for r in (leader, g):
            try:
                cluster.resume(f"replica-{r}")
            except Exception:  # noqa: BLE001 - resumed below by teardown anyway
                pass
    wait_until(lambda: env.leader("s2") >= 0, timeout_s=20, what="a leader of s2-0 after resuming")
    env.final_read(history, "s2", 0, timeout_s=15)
    violations = check(history)
    assert not violations, (
        f"DeleteRecords acknowledged low watermark {lw} without killed replica {f}; then {leader} and {g} "
        f"stopped and {f} restarted; leaders seen: {leaders_seen} ({probes} probes):\n{fmt_violations(violations)}")


# ---------------------------------------------------------------------------------- finding 5


def test_parked_fetches_do_not_wedge_the_leader(chaos_cluster):
    # The cap on a consumer's max_wait_ms: the replica's --fetch-max-wait-ms when it has that flag
    # (set to 5 s here to keep the schedule short); without it, assume the plausible default of 30 s.
    has_cap = "--fetch-max-wait-ms" in supported_flags(REPLICA_MODULE)
    cap_ms = 5000 if has_cap else 30_000
    cluster, env = chaos_cluster(replica_config={"fetch.max.wait.ms": str(cap_ms)} if has_cap else {})
    history = History()
    checks = SoftChecks()
    env.create_topic("parked")
    end = produce_batches(env, history, "parked", batches=2)
    leader = env.leader("parked")
    address = env.address(leader)
    # A connection of its own (not shared with the checks below), as an abusive client would have.
    channel = grpc.insecure_channel(address, options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])
    stub = replica_pb2_grpc.ReplicaStub(channel)
    request = replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=600_000, min_bytes=1 << 30, partitions=[
        replica_pb2.FetchPartition(topic="parked", partition=0, fetch_offset=end, partition_max_bytes=1 << 20)])
    n = 300
    sent = time.monotonic()
    futures = [stub.Fetch.future(request, timeout=700) for _ in range(n)]
    try:
        time.sleep(1.5)
        for fut in futures[::2]:
            fut.cancel()
        kept = futures[1::2]

        t0 = time.monotonic()
        try:
            res = env.produce("parked", 0, ids_for("while-parked", 0, 10), history=history, timeout_ms=5000)
            outcome = res.error.name if res.error else None
        except LowtideError as exc:
            outcome = f"{exc.name}: {exc.message}"
        took = time.monotonic() - t0
        checks.expect(outcome is None and took < 6, f"acks=all Produce with {n} fetches parked on leader {leader} "
                                                    f"({n // 2} cancelled): {outcome or 'ok'} after {took:.1f}s")

        followers = set(env.state("parked").replicas) - {leader}
        watch_until = time.monotonic() + LAG_TIME_MS / 1000 + 2
        isr_problem = ""
        while time.monotonic() < watch_until and not isr_problem:
            redis_isr = set(env.state("parked").isr)
            if not followers <= redis_isr:
                isr_problem = (f"followers {sorted(followers - redis_isr)} left the ISR "
                               f"(metadata ISR {sorted(redis_isr)})")
                break
            try:
                isr = set(env.describe(leader, "parked", timeout_s=2).isr)
                if not followers <= isr:
                    isr_problem = f"leader's DescribeLogs ISR {sorted(isr)} lost followers"
            except LowtideError as exc:
                isr_problem = f"leader {leader} did not answer DescribeLogs within 2 s: {exc.name}"
            time.sleep(0.5)
        checks.expect(not isr_problem, f"while the fetches were parked, for {LAG_TIME_MS / 1000 + 2:.0f}s "
                                       f"(> replica.lag.time.max.ms): {isr_problem}")

        cap_note = "" if has_cap else " (assumed: the replica has no --fetch-max-wait-ms)"
        deadline = sent + cap_ms / 1000 + 5
        for fut in kept:
            try:
                fut.exception(timeout=max(0.0, deadline - time.monotonic()))  # waits; returns the RPC error
            except grpc.FutureTimeoutError:
                break
        open_ = sum(not fut.done() for fut in kept)
        checks.expect(open_ == 0, f"{open_} of {len(kept)} parked fetches (max_wait_ms 600000) still open "
                                  f"{time.monotonic() - sent:.0f}s after they were sent; the server's wait cap is "
                                  f"{cap_ms} ms{cap_note}")
    finally:
        for fut in futures:
            fut.cancel()
        channel.close()
    checks.verify()


# ---------------------------------------------------------------------------------- finding 6


def _token(path: str | Path | None) -> str | None:
    if not path or not Path(path).is_file():
        return None
    lines = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return lines[0] if lines else None


def _fallback_admin(cluster) -> str:
    """Old code wrote no secrets: register an admin token and ACLs in the metadata store by hand, so
    that the schedule can still create a topic and show what the replica port accepts."""
    from lowtide.auth.acl import (
        CLUSTER_RESOURCE_NAME,
        AclBinding,
        AclOperation,
        AclPermission,
        PatternType,
        ResourceType,
    )
    from lowtide.auth.store import AclStore
    from lowtide.auth.tokens import add_token
    from lowtide.metadata.store import MetadataStore

    token, principal = "chaos-admin-token", "User:chaos-admin"
    metadata = MetadataStore.from_url(cluster.metadata_url)
    try:
        add_token(metadata, token=token, principal=principal)
        AclStore(metadata=metadata).add([
            AclBinding(principal, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME, PatternType.LITERAL, AclOperation.ALL,
                       AclPermission.ALLOW),
            AclBinding(principal, ResourceType.TOPIC, "*", PatternType.LITERAL, AclOperation.ALL, AclPermission.ALLOW)])
    finally:
        metadata.close()
    return token


def _outcome(fn) -> tuple[str | None, str]:
    """(error name or None, description) of a replica call; per-partition errors count too."""
    try:
        results = fn()
    except LowtideError as exc:
        return exc.name, f"call failed {exc.name}: {exc.message}"
    errs = [r.error for r in results if r.error is not None]
    if errs:
        return errs[0].name, f"per-partition {errs[0].name}: {errs[0].message}"
    first = results[0]
    fields = {k: getattr(first, k) for k in first.__slots__ if k not in ("records", "error")}
    if hasattr(first, "records"):
        fields["record_bytes"] = len(first.records)
    return None, f"success {type(first).__name__}{fields}"


def test_replica_port_requires_authentication(chaos_cluster):
    cluster, _ = chaos_cluster(auth_enabled=True)
    checks = SoftChecks()
    doc = cluster_json(cluster)
    auth = doc.get("auth") or {}
    secrets = cluster.data_dir / "secrets"
    admin_token = _token(auth.get("admin_token_file") or secrets / "admin.token")
    services = auth.get("services") or {}
    broker0_token = _token((services.get("replica-0") or {}).get("token_file") or secrets / "replica-0.token")
    checks.expect(admin_token is not None and broker0_token is not None,
                  f"cluster up with auth enabled wrote no admin/broker tokens (cluster.json auth: {auth or 'absent'}; "
                  f"looked in {secrets})")
    token = admin_token or _fallback_admin(cluster)
    admin_md = (("authorization", f"Bearer {token}"),)
    env = ChaosEnv(cluster, metadata=admin_md)
    anon = ReplicaClient()
    try:
        history = History()
        create_topic_retrying(env, "secure")
        end = produce_batches(env, history, "secure", batches=1, per_batch=5)
        st = env.state("secure")
        leader = st.leader
        address = env.address(leader)
        impostor = 1 if leader != 1 else 2  # a follower id that is neither the leader nor broker 0

        name, what = _outcome(lambda: anon.produce(address, [("secure", 0, encode_batch([b"anon"]))], acks=-1,
                                                   timeout_ms=5000, deadline_s=10))
        checks.expect(name in AUTH_FAILURES, f"Produce without a token on replica port {address}: {what}")
        name, what = _outcome(lambda: anon.fetch(address, [FetchPosition("secure", 0, 0)], max_wait_ms=0,
                                                 deadline_s=10))
        checks.expect(name in AUTH_FAILURES, f"consumer Fetch without a token: {what}")
        name, what = _outcome(lambda: anon.delete_records(address, [("secure", 0, 2)], timeout_ms=3000,
                                                          deadline_s=10))
        checks.expect(name in AUTH_FAILURES, f"DeleteRecords without a token: {what}")
        info = env.describe(leader, "secure")
        checks.expect((info.log_start_offset, info.log_end_offset) == (0, end),
                      f"unauthenticated calls changed the log: LSO/LEO {info.log_start_offset}/{info.log_end_offset}, "
                      f"expected 0/{end}")

        leo = info.log_end_offset
        follower_fetch = [FetchPosition("secure", 0, leo, current_leader_epoch=st.leader_epoch)]
        name, what = _outcome(lambda: env.replicas.fetch(address, follower_fetch, replica_id=impostor, max_wait_ms=0,
                                                         deadline_s=10))
        checks.expect(name == "CLUSTER_AUTHORIZATION_FAILED",
                      f"follower Fetch with the admin token as replica_id={impostor}: {what}")
        if broker0_token is not None:
            broker0 = ReplicaClient(metadata=(("authorization", f"Bearer {broker0_token}"),))
            try:
                name, what = _outcome(lambda: broker0.fetch(address, follower_fetch, replica_id=impostor,
                                                            max_wait_ms=0, deadline_s=10))
            finally:
                broker0.close()
            checks.expect(name == "CLUSTER_AUTHORIZATION_FAILED",
                          f"follower Fetch with broker-0's token as replica_id={impostor}: {what}")
        # control: the same calls with a proper identity work, so the failures above are about identity
        lso = env.describe(leader, "secure").log_start_offset
        name, what = _outcome(lambda: env.replicas.fetch(address, [FetchPosition("secure", 0, lso)], max_wait_ms=0,
                                                         deadline_s=10))
        checks.expect(name is None, f"control: consumer Fetch from the LSO {lso} with the admin token: {what}")
    finally:
        anon.close()
        env.close()
    checks.verify()


# ---------------------------------------------------------------------------------- finding 3


def _recrc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def lying_count_batch() -> bytes:
    """Two records whose header claims 2**31-1 (record count and last offset delta agree, the CRC
    is recomputed): only the records themselves can tell."""
    b = bytearray(encode_batch([encode_value("liar-0"), encode_value("liar-1")]))
    struct.pack_into(">i", b, 23, 2**31 - 2)  # LastOffsetDelta
    struct.pack_into(">i", b, 57, 2**31 - 1)  # RecordCount
    return _recrc(b)


def lying_count_only_batch() -> bytes:
    b = bytearray(encode_batch([encode_value("liar-0"), encode_value("liar-1")]))
    struct.pack_into(">i", b, 57, 2**31 - 1)
    return _recrc(b)


def gzip_lie_batch() -> bytes:
    """The gzip codec bit over an uncompressed body, CRC recomputed."""
    b = bytearray(encode_batch([encode_value("gz-0"), encode_value("gz-1")]))
    attrs = struct.unpack_from(">h", b, 21)[0]
    struct.pack_into(">h", b, 21, attrs | 1)
    return _recrc(b)


def test_lying_batch_is_rejected_and_changes_nothing(default_chaos_cluster):
    cluster, env = default_chaos_cluster
    history = History()
    checks = SoftChecks()
    cases = {"count": lying_count_batch(), "count-only": lying_count_only_batch(), "gzip": gzip_lie_batch()}
    for case, forged in cases.items():
        topic = f"lie-{case}"
        env.create_topic(topic)
        good = produce_batches(env, history, topic, batches=1, per_batch=5)
        leader = env.leader(topic)
        before = env.describe(leader, topic)
        try:
            [res] = env.replicas.produce(env.address(leader), [(topic, 0, forged)], acks=-1, timeout_ms=5000,
                                         deadline_s=10)
            err, outcome = res.error, (f"error {res.error.name}: {res.error.message}" if res.error
                                       else f"success at base offset {res.base_offset}")
        except LowtideError as exc:
            err, outcome = exc, f"call failed {exc.name}: {exc.message}"
        checks.expect(err is not None and err.name in ("CORRUPT_MESSAGE", "INVALID_RECORD"),
                      f"[{case}] Produce of a forged batch straight to leader {leader}: expected CORRUPT_MESSAGE "
                      f"or INVALID_RECORD, got {outcome}")
        after = env.describe(leader, topic)
        checks.expect((after.high_watermark, after.log_end_offset) == (before.high_watermark, before.log_end_offset),
                      f"[{case}] HW/LEO moved from {before.high_watermark}/{before.log_end_offset} to "
                      f"{after.high_watermark}/{after.log_end_offset}")
        values: list[bytes | None] = []
        problem = ""
        consumer = Consumer(cluster.bootstrap, max_wait_ms=200)
        try:
            consumer.assign([(topic, 0)])
            consumer.seek((topic, 0), 0)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(values) < good + 2:
                values += [r.value for r in consumer.poll(max_records=100)]
                if len(values) >= good and consumer.position((topic, 0)) >= env.describe(leader, topic).high_watermark:
                    break
        except Exception as exc:  # noqa: BLE001 - the consumer choking on stored garbage is the finding
            problem = f" (consumer failed: {type(exc).__name__}: {exc})"
        finally:
            consumer.close()
        want = [encode_value(f"{topic}-{i}", pad=100) for i in range(good)]
        checks.expect(values == want and not problem,
                      f"[{case}] a consumer from offset 0 read {len(values)} records "
                      f"{[decode_id(v) for v in values[:8]]}, expected the {good} earlier ones{problem}")
    checks.verify()


# ---------------------------------------------------------------------------------- finding 4


def test_delete_records_to_zero_answers_zero(default_chaos_cluster):
    cluster, env = default_chaos_cluster
    history = History()
    checks = SoftChecks()
    env.create_topic("zero", partitions=3)
    produce_batches(env, history, "zero", batches=1, per_batch=10, partition=2)
    for partition, offset, what in ((0, 0, "offset 0 on a fresh partition"), (1, -1, "offset -1 on an empty one"),
                                    (2, 0, "offset 0 on a partition holding 10 records")):
        tp = ("zero", partition)
        try:
            res = env.admin.delete_records({tp: offset}, timeout_ms=5000)[tp]
            outcome = (res.error.name if res.error else None, res.low_watermark)
        except LowtideError as exc:
            outcome = (f"call failed {exc.name}: {exc.message}", None)
        checks.expect(outcome == (None, 0), f"DeleteRecords {what}: expected success with low watermark 0, "
                                            f"got {outcome}")
    checks.verify()


# ---------------------------------------------------------------------------------- finding 7


def test_redis_outage_gives_retriable_typed_errors(default_chaos_cluster):
    cluster, env = default_chaos_cluster  # the last test of the module: redis-server is stopped and restarted
    history = History()
    env.create_topic("r7")
    produce_batches(env, history, "r7", batches=2)
    tp = ("r7", 0)
    cluster.stop_service("redis", timeout_s=10)
    try:
        t0 = time.monotonic()
        try:
            res = env.admin.delete_records({tp: 5}, timeout_ms=3000)[tp]
            err = res.error
        except LowtideError as exc:
            err = exc
        took = time.monotonic() - t0
    finally:
        cluster.start_service("redis")
    assert err is None or (err.retriable and err.name != "UNKNOWN_SERVER_ERROR"), (
        f"DeleteRecords through the front door with redis-server down answered {err.name} "
        f"(retriable={err.retriable}) after {took:.1f}s: {err.message}")
    lw = -1
    deadline = time.monotonic() + 20
    last: LowtideError | None = None
    while lw < 0 and time.monotonic() < deadline:
        try:
            res = env.admin.delete_records({tp: 5}, timeout_ms=3000)[tp]
            if res.error is None:
                lw = res.low_watermark
            else:
                last = res.error
        except LowtideError as exc:
            last = exc
        if lw < 0:
            time.sleep(0.3)
    assert lw >= 5, f"DeleteRecords did not succeed within 20 s after redis-server came back: {last!r}"
