package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/test/testenv"
)

// markdownLink is a Markdown link's target: [text](target).
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinksResolve: every relative link of the README and docs/ names
// a file committed to the repository (a bench result left out by
// .gitignore would resolve on the machine that ran it and nowhere else).
func TestDocsLinksResolve(t *testing.T) {
	root := testenv.RepoRoot()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	pages = append(pages, filepath.Join(root, "README.md"))
	tracked := trackedFiles(t, root)
	links := 0
	for _, page := range pages {
		data, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, m := range markdownLink.FindAllStringSubmatch(string(data), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path, err := filepath.Rel(root, filepath.Join(filepath.Dir(page), target))
			require.NoError(t, err)
			rel, _ := filepath.Rel(root, page)
			if _, err := os.Stat(filepath.Join(root, path)); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, m[1])
				continue
			}
			if tracked != nil && !tracked[path] && !tracked[path+"/"] {
				t.Errorf("%s links to %s, which git does not track (git add -f it, or link elsewhere)", rel, m[1])
			}
		}
	}
	assert.Greater(t, links, 10, "the pages' relative links were found")
}

// trackedFiles is every path git tracks under root, and each directory
// holding one (with a trailing slash); nil outside a git checkout.
func trackedFiles(t *testing.T, root string) map[string]bool {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files").Output()
	if err != nil {
		t.Logf("not a git checkout (%v): links are checked against the files on disk only", err)
		return nil
	}
	tracked := map[string]bool{}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		tracked[f] = true
		for dir := filepath.Dir(f); dir != "."; dir = filepath.Dir(dir) {
			tracked[dir+"/"] = true
		}
	}
	return tracked
}
