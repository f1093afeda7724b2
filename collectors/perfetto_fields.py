"""Field numbers of the Perfetto trace messages the writer encodes by hand.

From perfetto's `protos/perfetto/trace` (TracePacket, TrackDescriptor, TrackEvent,
InternedData); tests parse the written bytes with perfetto's generated classes, so
a wrong number here fails them.
"""

# TracePacket fields
P_TIMESTAMP = 8
P_SEQ_ID = 10
P_TRACK_EVENT = 11
P_INTERNED = 12
P_FLAGS = 13
P_TRACK_DESCRIPTOR = 60
P_FIRST_ON_SEQUENCE = 87
# TrackDescriptor fields
D_UUID = 1
D_NAME = 2
D_PROCESS = 3
D_THREAD = 4
D_PARENT = 5
D_COUNTER = 8
UNIT_SIZE_BYTES = 3  # CounterDescriptor.Unit
# TrackEvent fields
E_CATEGORY_IIDS = 3
E_DEBUG = 4
E_TYPE = 9
E_NAME_IID = 10
E_TRACK = 11
E_COUNTER = 30
E_DOUBLE_COUNTER = 44
E_FLOW_IDS = 47
E_TERMINATING_FLOW_IDS = 48
# InternedData fields
I_CATEGORIES = 1
I_NAMES = 2
I_ANNOTATION_NAMES = 3
