// Package controllers reconciles Proxies: it decides, from a Proxy and what
// its provider reports, the one action to take next, and takes it. It talks
// to providers only through the providers package's interface and must never
// import a concrete provider.
package controllers
