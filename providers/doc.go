// Package providers defines how the operator talks to the places proxies run:
// the Provider interface, its typed errors, and the providers config that
// names provider instances. It must never import the controllers, and the
// controllers must never import a concrete provider: they meet only here.
package providers
