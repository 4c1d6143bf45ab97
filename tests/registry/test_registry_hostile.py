"""The registry client against a server that misbehaves: each case ends in one clear line,
exit status 125, and nothing in the cache."""
import pytest


def uri(hostile, repository):
    return f"docker://{hostile.address}#{repository}/image:1"


def test_the_imitation_is_a_registry_the_client_accepts(puller, hostile):
    pulled = puller.pull(uri(hostile, "good"))
    assert pulled["layers"][0]["digest"] == hostile.layer_digest
    assert pulled["manifest_digest"] == hostile.manifest_digest


@pytest.mark.parametrize("repository, message", [
    ("bad-digest", "does not match its digest"),
    ("truncated", "closed early"),
    ("short", "truncated"),
    ("oversized", "larger than its declared size"),
    ("huge-manifest", "larger than the limit"),
    ("redirect-loop", "too many redirects"),
    ("unauthorized", "refused access"),
])
def test_hostile_server_gives_one_line_and_leaves_nothing(puller, hostile, repository, message):
    line = puller.fails(uri(hostile, repository), "--retries", "1")
    assert message in line, line
    assert puller.cached_files() == []


def test_a_stalled_server_times_out(puller, hostile):
    line = puller.fails(uri(hostile, "slow"), "--retries", "0", "--stall-timeout", "2")
    assert "manifest" in line and ("too slow" in line or "timed out" in line.lower()), line
    assert puller.cached_files() == []


def test_transient_failures_are_retried(puller, hostile):
    pulled = puller.pull(uri(hostile, "flaky"), "--retries", "1")
    assert pulled["layers"][0]["digest"] == hostile.layer_digest


def test_authorization_stays_with_the_registry_across_a_redirect(puller, hostile):
    hostile.storage.authorization_seen.clear()
    pulled = puller.pull(uri(hostile, "redirected"))
    assert pulled["layers"][0]["digest"] == hostile.layer_digest
    # The registry got the token; the storage on another host got both blobs, without it.
    assert len(hostile.storage.authorization_seen) == 2
    assert hostile.storage.authorization_seen == [None, None]
    assert any(auth == "Bearer opaque-token" for path, auth in hostile.authorization_seen
               if path.startswith("/v2/redirected/"))
