// Package discovery is the HTTP API crawler clients use to list, lease and
// release proxies and to report rate limiting: the codec, the bearer-token
// and tenant middleware, and handlers that map the broker's answers to
// HTTP. Every decision of who gets which proxy is the broker's (package
// broker), which the rotating gateway calls too; discovery only speaks
// HTTP over it. It must never call the API server per request, never write
// the API, and never import the gateway, the controllers, the providers or
// the health engine (depguard enforces the imports).
package discovery
