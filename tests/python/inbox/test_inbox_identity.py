"""The inbox hands back the objects that were queued (a cache in the binding), never stale ones."""

import kerman


def _inbox() -> kerman.Inbox:
    return kerman.Inbox(kerman.MemoryStore().create())


def test_claim_get_and_lists_return_the_queued_objects() -> None:
    inbox = _inbox()
    a, b = kerman.UserMessage("a", id="a"), kerman.UserMessage("b", id="b")
    assert inbox.append("next-step", a) is a
    assert inbox.append("next-turn", b) is b
    assert inbox.get("a") is a
    assert inbox.next_step[0] is a and inbox.next_turn[0] is b
    batch = inbox.claim("next-turn", 1)
    assert batch[0] is a and batch[1] is b


def test_replaced_and_removed_messages_are_not_returned_again() -> None:
    inbox = _inbox()
    first = kerman.UserMessage("one", id="x")
    inbox.append("next-turn", first)
    second = kerman.UserMessage("two", id="x")
    assert inbox.replace("x", second)
    assert inbox.get("x") is second
    assert inbox.remove("x")
    third = kerman.UserMessage("three", id="x")
    inbox.splice("next-turn", 0, 0, [third])
    assert inbox.get("x") is third
    assert inbox.clear() == [third] and inbox.clear() == []
    assert inbox.get("x") is None


def test_str_prompts_and_many_messages() -> None:
    inbox = _inbox()
    m = inbox.append("next-turn", "hello")
    assert inbox.get(m.id) is m
    msgs = [kerman.UserMessage(f"m{i}", id=f"m{i}") for i in range(200)]
    for x in msgs:
        inbox.append("next-step", x)
    assert all(got is want for got, want in zip(inbox.claim("next-step", 0), msgs, strict=True))
    assert inbox.next_turn == (m,) and inbox.claim("next-turn", 1)[0] is m
    assert len(inbox) == 0


def test_duplicate_append_keeps_the_pending_object() -> None:
    inbox = _inbox()
    a = kerman.UserMessage("a", id="a")
    inbox.append("next-turn", a)
    try:
        inbox.append("next-turn", kerman.UserMessage("other", id="a"))
    except kerman.errors.DuplicateMessageError:
        pass
    assert inbox.get("a") is a


def test_a_claim_as_large_as_the_cache_but_of_other_messages_keeps_the_cached_ones() -> None:
    # The claim's fast path empties the whole cache when the batch is as long as it; a cached
    # message outside the batch must go back in. Replayed messages start uncached.
    store = kerman.MemoryStore()
    log = store.create()
    kerman.Inbox(log).append("next-step", kerman.UserMessage("replayed", id="r"))
    log.close()
    inbox = kerman.Inbox(store.open(log.id))
    queued = kerman.UserMessage("queued", id="q")
    inbox.append("next-turn", queued)
    (replayed,) = inbox.claim("next-step", 1)
    assert replayed.id == "r" and replayed.text == "replayed"
    assert inbox.get("q") is queued
    assert inbox.claim("next-turn", 2)[0] is queued
