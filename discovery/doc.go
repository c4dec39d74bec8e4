// Package discovery is the HTTP API crawler clients use to list, lease and
// release proxies and to report rate limiting. It serves from the manager's
// cache and the health verdicts and must never call the API server per
// request.
package discovery
