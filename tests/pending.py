"""Read pending jobs across a queue's shards, as tests see the tree (tree.LAYOUT)."""

from kazoo.exceptions import NoNodeError


def pending_nodes(client, layout, queue: str = "default") -> list[str]:
    """Every pending job node of a queue, in assignment order (shards, then names)."""
    try:
        shards = sorted(client.get_children(layout.queue(queue)))
    except NoNodeError:
        return []
    nodes = []
    for shard in shards:
        try:
            nodes.extend(sorted(client.get_children(layout.shard(queue, shard))))
        except NoNodeError:
            continue
    return nodes


def delayed_nodes(client, layout) -> list[str]:
    """Every delayed job's name across its shards (delayed/{minute}/{second}/{name})."""
    names = []
    for minute in _children(client, layout.delayed):
        for second in _children(client, layout.delayed_minute(minute)):
            names.extend(_children(client, layout.delayed_shard(minute, second)))
    return sorted(names)


def _children(client, path: str) -> list[str]:
    try:
        return client.get_children(path)
    except NoNodeError:
        return []
