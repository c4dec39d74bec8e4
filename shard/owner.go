package shard

import (
	"crypto/rand"
	"encoding/hex"
	"hash/fnv"
)

// Owner is the member that owns key among members: the one with the
// highest rendezvous hash of (member, key), the lower identity on a tie.
// A member that joins takes from each of the others an even part of its
// share, and one that leaves hands its share out evenly: nothing else
// moves. "" when there are no members.
func Owner(members []string, key string) string {
	var owner string
	var best uint64
	for _, m := range members {
		score := rendezvous(m, key)
		if owner == "" || score > best || score == best && m < owner {
			owner, best = m, score
		}
	}
	return owner
}

// rendezvous is the score of member for key: FNV-1a of both, finished by
// SplitMix64's mixer so that members whose names differ in one character
// still get independent scores.
func rendezvous(member, key string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(key))
	z := h.Sum64()
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// randomSuffix is 8 random hex digits.
func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
