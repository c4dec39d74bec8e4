package gateway_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/test/simweb"
)

// chromium is Debian's headless-capable browser, or the test fails with
// how to install it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Fatal("chromium is missing: apt-get install -y chromium")
	return ""
}

// ipSite is an HTTPS site whose pages show the address they were asked
// from (the upstream's exit IP) and link to next.
func ipSite(t *testing.T, ip string) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		from, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = fmt.Fprintf(w, `<!doctype html><title>%s</title><p id="ip">%s</p><a id="next" href="%s">next</a>`,
			r.URL.Path, from, r.URL.Query().Get("next"))
	}))
	lis, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	srv.Listener = lis
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// browserContext is one browser context (its own cookies, connections and
// proxy credentials) whose proxy challenges are answered with username
// and the gateway's token through the DevTools protocol.
func browserContext(browser context.Context, t *testing.T, username string) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	// The listener runs in the tab's read loop: it answers from goroutines
	// of its own.
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *fetch.EventRequestPaused:
			go func() {
				_, _ = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
			}()
		case *fetch.EventAuthRequired:
			reply := &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseCancelAuth}
			if ev.AuthChallenge.Source == fetch.AuthChallengeSourceProxy {
				reply = &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: username, Password: token}
			}
			go func() {
				_, _ = chromedp.Call(ctx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: ev.RequestID, AuthChallengeResponse: reply})
			}()
		}
	}))
	handle := true
	_, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handle})
	require.NoError(t, err)
	return ctx
}

// visit loads url, or follows the page's link when url is "", and returns
// the address the site saw.
func visit(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if url != "" {
		if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
			return "", err
		}
	} else {
		next, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.ID("next"), "href"))
		if err != nil {
			return "", err
		}
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("next"))); err != nil {
			return "", err
		}
		// The click navigates: wait for the linked page.
		for {
			here, err := chromedp.Run(ctx, chromedp.Location())
			if err != nil {
				return "", err
			}
			if here == next.Value {
				break
			}
			if !sleepCtx(ctx, 50*time.Millisecond) {
				return "", fmt.Errorf("following the link to %s: still on %s: %w", next.Value, here, ctx.Err())
			}
		}
	}
	ip, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("ip")))
	return strings.TrimSpace(ip), err
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// A real headless Chromium through the gateway, with credentials answered
// through the DevTools protocol: a strict session keeps one exit IP across
// page loads and navigations between two HTTPS sites; two contexts with
// two sessions leave through two proxies; a killed upstream ends the
// strict session with the documented error.
func TestChromiumThroughTheGateway(t *testing.T) {
	bin := chromium(t)
	f := newFixture(t, gateway.Options{})
	shop, news := ipSite(t, "127.0.0.84"), ipSite(t, "127.0.0.85")

	alloc, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox, // CI runs as root
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.ProxyServer("http://"+f.gwAddr),
		// Chromium sends loopback addresses direct unless told otherwise.
		chromedp.Flag("proxy-bypass-list", "<-loopback>"),
		chromedp.Flag("ignore-certificate-errors", true), // the sites' test certificates
	)...)
	t.Cleanup(cancel)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser), "starting %s", bin)

	// Strict and exclusive: each session holds a proxy of its own.
	a := browserContext(browser, t, "browser-session-a-strict-exclusive")
	b := browserContext(browser, t, "browser-session-b-strict-exclusive")
	shopURL := func(path string) string { return shop.URL + path + "?next=" + news.URL + path + "-next" }
	newsURL := func(path string) string { return news.URL + path + "?next=" + shop.URL + path + "-next" }

	exitA, err := visit(a, shopURL("/a1"))
	require.NoError(t, err)
	require.Contains(t, f.byIP, exitA, "the site saw one of the fleet's proxies")
	for step, url := range []string{"", newsURL("/a2"), "", shopURL("/a3")} {
		ip, err := visit(a, url)
		require.NoError(t, err, "step %d", step)
		assert.Equal(t, exitA, ip, "step %d (%q): one exit IP for the strict session", step, url)
	}
	exitB, err := visit(b, newsURL("/b1"))
	require.NoError(t, err)
	assert.NotEqual(t, exitA, exitB, "two sessions, two proxies")
	ip, err := visit(b, "")
	require.NoError(t, err)
	assert.Equal(t, exitB, ip)

	// A's proxy dies: its next page fails as browsers show a 502 to
	// CONNECT, and the gateway counts the lost session; B goes on.
	before := errorsCounted(t, "destination_unavailable", gateway.CauseSessionLost)
	f.squids[f.byIP[exitA]].Stop()
	_, err = visit(a, newsURL("/a4"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ERR_TUNNEL_CONNECTION_FAILED")
	assert.Greater(t, errorsCounted(t, "destination_unavailable", gateway.CauseSessionLost), before)
	ip, err = visit(b, shopURL("/b2"))
	require.NoError(t, err)
	assert.Equal(t, exitB, ip, "the other session keeps its exit IP")
}

// A real headless Chromium crawls a site that allows each IP 2 requests in
// any second and bans it after three violations, with a policy declaring
// a little under that. One context navigates page after page over one kept-alive
// HTTP/2 tunnel, which the gateway paces turn by turn; another opts into
// the inspecting mode and loads pages of six images each, multiplexed over
// HTTP/2, which the gateway paces request by request. Every page and image
// loads, the site answers no 429, and it bans no IP.
func TestChromiumKeepsASlidingWindowThroughTheGateway(t *testing.T) {
	bin := chromium(t)
	const perSecond = 2
	site, err := simweb.Start("127.0.0.87", true, simweb.Rules{PerWindow: perSecond, Window: simweb.Duration(time.Second),
		BanAfter: 3, BanWindow: simweb.Duration(30 * time.Second), BanFor: simweb.Duration(time.Hour)})
	require.NoError(t, err)
	t.Cleanup(site.Close)
	host := site.Host
	f, _ := inspectFixture(t, func(o *discovery.Options) {
		// A little under the site's rule, as a careful team declares it:
		// the race detector may delay a request past the jitter allowance.
		o.Politeness = broker.Politeness{Policies: lazyPolicy{host: &host, n: perSecond, per: 1250 * time.Millisecond}}
	}, site.Certificate())

	alloc, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox, // CI runs as root
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.ProxyServer("http://"+f.gwAddr),
		chromedp.Flag("proxy-bypass-list", "<-loopback>"),
		// The site's test certificate, and the team's inspecting CA.
		chromedp.Flag("ignore-certificate-errors", true),
	)...)
	t.Cleanup(cancel)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser), "starting %s", bin)

	tunnelled := browserContext(browser, t, "browser-pages")
	for i := range 8 {
		ctx, cancel := context.WithTimeout(tunnelled, 30*time.Second)
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/page/%d", site.URL, i))), "page %d", i)
		cancel()
	}
	inspected := browserContext(browser, t, "browser-gallery.inspect")
	for i := range 3 {
		ctx, cancel := context.WithTimeout(inspected, 60*time.Second)
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/gallery/%d?images=6", site.URL, i))), "gallery %d", i)
		cancel()
	}
	st := site.Stats()
	assert.Equal(t, 8+3*7, st.Pages(), "every page and image was served")
	assert.Zero(t, st.Answers[simweb.AnswerLimited], "the site answered no 429")
	assert.Empty(t, st.Banned, "the site banned no IP")
}
