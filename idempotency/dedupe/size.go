package dedupe

import (
	"sort"
	"unsafe"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
)

// What records cost on the heap. Go's allocator rounds every object up to
// a size class, maps hold their entries in groups of 8 slots with room to
// spare, and a metadata.MD of one pair is a map, a slice and two strings:
// counting only the bytes of keys and values undercounted a record with
// one header and one trailer by a factor of 2.5. These functions count
// what the allocator sets aside, as the Go 1.26 runtime does; the memory
// tests check the result against runtime.ReadMemStats.

// sizeClasses are the runtime's small object size classes
// (internal/runtime/gc.SizeClassToSize).
var sizeClasses = [...]int{8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
	288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408, 1536, 1792, 2048,
	2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240, 10880,
	12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768}

// pageSize is the granularity of objects larger than the largest class.
const pageSize = 8192

// allocSize returns the bytes the allocator sets aside for an object of n
// bytes: 0 for none.
func allocSize(n int) int64 {
	switch {
	case n <= 0:
		return 0
	case n > sizeClasses[len(sizeClasses)-1]:
		return int64((n + pageSize - 1) / pageSize * pageSize)
	}
	return int64(sizeClasses[sort.SearchInts(sizeClasses[:], n)])
}

// Sizes of the structures a record and an entry are made of.
const (
	mapHeaderSize   = 48 // internal/runtime/maps.Map
	mapTableSize    = 32 // internal/runtime/maps.table
	mapGroupSlots   = 8
	mapTableSlots   = 1024 // internal/runtime/maps.maxTableCapacity
	stringSize      = int(unsafe.Sizeof(""))
	sliceSize       = int(unsafe.Sizeof([]byte(nil)))
	pointerSize     = int(unsafe.Sizeof(uintptr(0)))
	recordSize      = int(unsafe.Sizeof(Record{}))
	anySize         = int(unsafe.Sizeof(anypb.Any{}))
	mdSlotSize      = stringSize + sliceSize // a map[string][]string slot
	entrySize       = int(unsafe.Sizeof(entry{}))
	identitySize    = int(unsafe.Sizeof(identity{}))
	entriesSlotSize = int(unsafe.Sizeof(Scope{})) + pointerSize // a map[Scope]*entry slot
	idsSlotSize     = stringSize + pointerSize                  // a map[string]*identity slot
)

// mapSize returns what a map of n entries, each slot (key and value)
// slot bytes, holds when grown one insertion at a time: its header, and
// groups of 8 slots and 8 control bytes, filled to at most 7/8.
func mapSize(n, slot int) int64 {
	size := allocSize(mapHeaderSize)
	if n == 0 {
		return size
	}
	group := mapGroupSlots + mapGroupSlots*slot
	if n <= mapGroupSlots { // one group, no table
		return size + allocSize(group)
	}
	capacity := 2 * mapGroupSlots
	for capacity*7/8 < n {
		capacity *= 2
	}
	tables := max(capacity/mapTableSlots, 1)
	perTable := min(capacity, mapTableSlots)
	return size + allocSize(tables*pointerSize) +
		int64(tables)*(allocSize(mapTableSize)+allocSize(perTable/mapGroupSlots*group))
}

// mapSlotSize is what one more entry of a large map costs on average: a
// slot and its control byte, in a map between just after it doubled (7/16
// full) and just before (7/8 full), 21/32 full on average.
func mapSlotSize(slot int) int64 { return int64((1 + slot) * 32 / 21) }

// mdSize returns what md holds: its map, and each key, value slice and
// value. A key or value shared with other records (a string literal) is
// counted too.
func mdSize(md metadata.MD) int64 {
	if md == nil {
		return 0
	}
	n := mapSize(len(md), mdSlotSize)
	for k, vs := range md {
		n += allocSize(len(k)) + allocSize(cap(vs)*stringSize)
		for _, v := range vs {
			n += allocSize(len(v))
		}
	}
	return n
}

// Size returns what r holds on the heap, in bytes: the Record itself, the
// response bytes, the stream responses, the message, the status details
// and the header and trailer metadata, each as the Go allocator rounds it.
// The method name in r.Fingerprint is not counted: it is the name grpc
// passes, shared by every record of the method.
func (r *Record) Size() int64 {
	n := allocSize(recordSize) + allocSize(cap(r.Response)) + allocSize(len(r.Message))
	if r.Responses != nil {
		n += allocSize(cap(r.Responses) * sliceSize)
		for _, b := range r.Responses {
			n += allocSize(cap(b))
		}
	}
	if r.Details != nil {
		n += allocSize(cap(r.Details) * pointerSize)
		for _, d := range r.Details {
			n += allocSize(anySize) + allocSize(len(d.GetTypeUrl())) + allocSize(cap(d.GetValue()))
		}
	}
	return n + mdSize(r.Header) + mdSize(r.Trailer)
}

// responseCost is what one more stream response of n bytes adds to
// Record.Size, not counting the growth of the Responses slice.
func responseCost(n int) int64 { return allocSize(n) + int64(sliceSize) }

// entryCost is what a MemoryStore holds for an entry of key in flight:
// the entry, its slot in the map of entries, the key, and a Record, the
// least its outcome will take (a tombstone).
func entryCost(key string) int64 {
	return allocSize(entrySize) + mapSlotSize(entriesSlotSize) + allocSize(len(key)) + allocSize(recordSize)
}

// identityCost is what a MemoryStore holds for an identity that holds
// entries: its bookkeeping, its slot in the map of identities, and its
// name.
func identityCost(name string) int64 {
	return allocSize(identitySize) + mapSlotSize(idsSlotSize) + allocSize(len(name))
}
