// Package discovery is the HTTP API crawler clients use to list, lease and
// release proxies and to report rate limiting. It serves from the manager's
// cache and the health verdicts: it must never call the API server per
// request, never write the API, and never import the controllers, the
// providers or the health engine (depguard enforces the imports).
package discovery
