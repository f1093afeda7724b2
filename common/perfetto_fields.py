"""Field numbers of the Perfetto trace messages: the one place both the writer (which
encodes them by hand) and the explorer's loader (which scans them column-wise) read.

From perfetto's `protos/perfetto/trace` (TracePacket, TrackDescriptor, TrackEvent,
InternedData, DebugAnnotation); tests parse the written bytes with perfetto's generated
classes and load traces written by them, so a wrong number here fails them.
"""

# TracePacket fields
P_TIMESTAMP = 8
P_SEQ_ID = 10
P_TRACK_EVENT = 11
P_INTERNED = 12
P_FLAGS = 13
P_INCREMENTAL_STATE_CLEARED = 41
P_PREVIOUS_PACKET_DROPPED = 42
P_TIMESTAMP_CLOCK_ID = 58
P_TRACE_PACKET_DEFAULTS = 59
P_TRACK_DESCRIPTOR = 60
P_FIRST_ON_SEQUENCE = 87
SEQ_INCREMENTAL_STATE_CLEARED = 1  # a bit of P_FLAGS
# TracePacketDefaults -> TrackEventDefaults fields
DEFAULTS_TRACK_EVENT = 11
DEFAULTS_TRACK_UUID = 11
# TrackDescriptor fields
D_UUID = 1
D_NAME = 2
D_PROCESS = 3
D_THREAD = 4
D_PARENT = 5
D_COUNTER = 8
D_STATIC_NAME = 10
UNIT_SIZE_BYTES = 3  # CounterDescriptor.Unit
# ProcessDescriptor and ThreadDescriptor fields
PROCESS_PID = 1
PROCESS_NAME = 6
THREAD_PID = 1
THREAD_TID = 2
THREAD_NAME = 5
# TrackEvent fields
E_CATEGORY_IIDS = 3
E_DEBUG = 4
E_TYPE = 9
E_NAME_IID = 10
E_TRACK = 11
E_CATEGORIES = 22
E_NAME = 23
E_COUNTER = 30
E_FLOW_IDS_OLD = 36
E_TERMINATING_FLOW_IDS_OLD = 42
E_DOUBLE_COUNTER = 44
E_FLOW_IDS = 47
E_TERMINATING_FLOW_IDS = 48
# TrackEvent.Type values
TYPE_SLICE_BEGIN = 1
TYPE_SLICE_END = 2
TYPE_INSTANT = 3
TYPE_COUNTER = 4
# InternedData fields
I_CATEGORIES = 1
I_NAMES = 2
I_ANNOTATION_NAMES = 3
I_DEBUG_ANNOTATION_STRING_VALUES = 29
# EventName, EventCategory, DebugAnnotationName, InternedString: iid and the text
INTERNED_IID = 1
INTERNED_TEXT = 2
# DebugAnnotation fields
A_NAME_IID = 1
A_BOOL = 2
A_UINT = 3
A_INT = 4
A_DOUBLE = 5
A_STRING = 6
A_POINTER = 7
A_NESTED = 8
A_JSON = 9
A_NAME = 10
A_DICT = 11
A_ARRAY = 12
A_STRING_IID = 17
