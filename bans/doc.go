// Package bans is the ban judge: it reads what the sites made of each
// proxy lately (the lease store's outcome memory), decides which proxies
// enough hosts block to be recycled, and which hosts block so much of a
// fleet at once that the host is suspect rather than the proxies, and
// writes its verdict as the Banned condition (field manager
// FieldManagerBans). It burns a banned proxy's exit IPs first, so its
// successor can never come up on one unnoticed. The Proxy reconciler and
// the pool controller act on the condition; the judge never creates,
// replaces or deletes anything.
//
// It must never import the controllers, the health engine or a provider.
package bans
