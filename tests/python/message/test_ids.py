"""Message ids (src/ids.rs): UUIDv7, unique, sorted in the order one process makes them, and
never repeated between a process and a child it forks (the ids' random bits come from a
batch fetched from the OS, which a forked child must not reuse)."""

import os
import uuid

import pytest

import kerman


def test_ids_are_uuid7_unique_and_in_creation_order():
    ids = [kerman.UserMessage("x").id for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    assert sorted(ids) == ids
    assert all(uuid.UUID(i).version == 7 for i in ids[:50])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_makes_the_parents_next_ids():
    kerman.UserMessage("warm the pool up")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its ids and leave at once
        try:
            ids = "\n".join(kerman.UserMessage("child").id for _ in range(2000))
            os.write(write, ids.encode())
        finally:
            os._exit(0)
    os.close(write)
    first_parent = [kerman.UserMessage("parent").id]
    parent = set(first_parent) | {kerman.UserMessage("parent").id for _ in range(1999)}
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    child_ids = b"".join(chunks).decode().split("\n")
    child = set(child_ids)
    assert len(child) == 2000
    assert not parent & child
    # Stronger than no overlap (which different milliseconds alone would give): the child's
    # random bits are its own. Without fork detection both processes' first ids take the same
    # bits from the inherited batch.
    assert random_bits(child_ids[0]) != random_bits(first_parent[0])
    assert random_bits(child_ids[0]) not in {random_bits(i) for i in parent}


def random_bits(id: str) -> int:
    """The 74 random bits (and the variant) of a UUIDv7: everything below the version."""
    return uuid.UUID(id).int & ((1 << 76) - 1)
