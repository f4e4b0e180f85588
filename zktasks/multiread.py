"""ZooKeeper's multiRead: many getData in one request, which kazoo 2.11 does not offer.

A worker reads the status record of every job assigned to it. Sent as one get_async per
job, the reads already share a round trip, but each is still a request of its own: a
trip through kazoo's connection thread and ZooKeeper's request pipeline, with a reply to
decode and an AsyncResult to wake. ZooKeeper 3.6 added OpCode.multiRead (22): getData
operations in one request, answered in one reply, each with its own result or error (a
missing node fails only its own read; nothing is atomic about it).

The wire format is ZooKeeper's MultiOperationRecord and MultiResponse: for each operation
a MultiHeader(type, done=false, err) and the operation's record, then a MultiHeader(-1,
true, -1). A read answers GetDataResponse (data, stat) or, with type -1, ErrorResponse
(err). The request goes through kazoo's own `_call`, as its built-in requests do, so
connection loss, session expiry and chroot behave alike.
"""

from collections import namedtuple

from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import (
    GetData,
    MultiHeader,
    int_struct,
    multiheader_struct,
    read_buffer,
    stat_struct,
)
from kazoo.protocol.states import ZnodeStat

OPCODE = 22  # ZooDefs.OpCode.multiRead (ZooKeeper 3.6+)
_ERROR = -1  # ZooDefs.OpCode.error


class MultiRead(namedtuple("MultiRead", "paths")):
    type = OPCODE

    def serialize(self) -> bytearray:
        buffer = bytearray()
        head = multiheader_struct.pack(GetData.type, False, -1)
        for path in self.paths:
            buffer.extend(head)
            buffer.extend(GetData(path, None).serialize())
        buffer.extend(multiheader_struct.pack(-1, True, -1))
        return buffer

    @classmethod
    def deserialize(cls, buffer, offset) -> list:
        """[(data, ZnodeStat) or a KazooException instance] in the order of the paths."""
        results = []
        while True:
            header, offset = MultiHeader.deserialize(buffer, offset)
            if header.done:
                return results
            if header.type == GetData.type:
                data, offset = read_buffer(buffer, offset)
                results.append((data, ZnodeStat._make(stat_struct.unpack_from(buffer, offset))))
                offset += stat_struct.size
            elif header.type == _ERROR:
                code = int_struct.unpack_from(buffer, offset)[0]
                offset += int_struct.size
                results.append(EXCEPTIONS[code]())
            else:
                raise ValueError(f"unexpected operation {header.type} in a multiRead reply")


def get_many_async(client, paths):
    """Send one multiRead of `paths`; its result is MultiRead.deserialize's list."""
    result = client.handler.async_result()
    client._call(MultiRead(tuple(_prefix_root(client.chroot, p) for p in paths)), result)
    return result
