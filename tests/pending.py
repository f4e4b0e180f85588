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
