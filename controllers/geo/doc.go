// Package geo writes where each Proxy's exit IP is, as sites see it: a
// Proxy's status.geo from the geo database (package geoip), and a Warning
// Event GeoMismatch when the database contradicts what the Proxy declares
// (its country or asn attribute, or its cloud region's country).
//
// Its decision is a pure function (Judge) of the Proxy and the database's
// answer; the reconciler around it only reads Proxies and applies the one
// field it owns. It never imports the Proxy reconciler's package, a
// provider, the health engine or discovery: depguard enforces it.
package geo
