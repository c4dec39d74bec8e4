// Package geoip says where an IP address is, as the sites a crawler visits
// see it: its country, city and network (ASN) from the MaxMind-format
// databases a user mounts (GeoLite2, DB-IP Lite or a commercial one),
// reloaded when a file changes. It also knows which country each public
// cloud region is in, so a declared region can be checked against what the
// database says.
//
// It knows nothing of Proxies or Kubernetes: it must never import the
// operator's other packages (the API types included).
package geoip
