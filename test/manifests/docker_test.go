package manifests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// buildContext is what `docker build -f dockerfile .` sends from the
// repository: every file its ignore file admits, by Docker's own matcher
// (BuildKit prefers <Dockerfile>.dockerignore over .dockerignore).
func buildContext(t *testing.T, dockerfile string) []string {
	t.Helper()
	root := testenv.RepoRoot()
	ignore := filepath.Join(root, dockerfile+".dockerignore")
	if _, err := os.Stat(ignore); err != nil {
		ignore = filepath.Join(root, ".dockerignore")
	}
	data, err := os.ReadFile(ignore)
	require.NoError(t, err)
	patterns, err := ignorefile.ReadAll(bytes.NewReader(data))
	require.NoError(t, err)
	pm, err := patternmatcher.New(patterns)
	require.NoError(t, err)
	var files []string
	require.NoError(t, filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == ".git" || rel == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		excluded, err := pm.MatchesOrParentMatches(rel)
		if err == nil && !excluded {
			files = append(files, rel)
		}
		return err
	}))
	return files
}

// copiedSources are the local sources of a Dockerfile's COPY lines (not
// those copied from another stage).
func copiedSources(t *testing.T, dockerfile string) []string {
	t.Helper()
	var sources []string
	for _, line := range strings.Split(string(repoFile(t, dockerfile)), "\n") {
		args, ok := strings.CutPrefix(line, "COPY ")
		if !ok || strings.HasPrefix(args, "--from=") {
			continue
		}
		fields := strings.Fields(args)
		sources = append(sources, fields[:len(fields)-1]...)
	}
	require.NotEmpty(t, sources, dockerfile)
	return sources
}

func under(files []string, source string) []string {
	source = strings.TrimSuffix(filepath.Clean(source), "/")
	var out []string
	for _, f := range files {
		if f == source || strings.HasPrefix(f, source+"/") {
			out = append(out, f)
		}
	}
	return out
}

// TestDockerBuildContexts: each image's COPY sources reach the builder, and
// the operator image holds every package the binary is built from, so a
// new package cannot be left out of the image unnoticed.
func TestDockerBuildContexts(t *testing.T) {
	for _, dockerfile := range []string{"Dockerfile", "bundle.Dockerfile"} {
		files := buildContext(t, dockerfile)
		for _, src := range copiedSources(t, dockerfile) {
			assert.NotEmpty(t, under(files, src), "%s copies %s, which its ignore file leaves out of the build context", dockerfile, src)
		}
	}

	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", ".")
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	files := buildContext(t, "Dockerfile")
	sources := copiedSources(t, "Dockerfile")
	root, _ := filepath.Abs(testenv.RepoRoot())
	var local int
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a module dependency: go mod download fetches it
		}
		local++
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			name := filepath.Join(rel, e.Name())
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			name = filepath.Clean(name)
			copied := slices.ContainsFunc(sources, func(src string) bool { return len(under([]string{name}, src)) > 0 })
			assert.True(t, copied, "the binary is built from %s, which the Dockerfile does not COPY", name)
			assert.Contains(t, files, name, "the binary is built from %s, which .dockerignore leaves out", name)
		}
	}
	assert.Greater(t, local, 5, "go list found the operator's own packages")
}

// TestTestsBuildTheShippedBinary: the e2e tests and the benchmarks build
// the operator as the image does (the binary's pages are a third of its
// resident memory, so a benchmark of another build measures another
// program).
func TestTestsBuildTheShippedBinary(t *testing.T) {
	var build string
	for _, line := range strings.Split(string(repoFile(t, "Dockerfile")), "\n") {
		if strings.Contains(line, " go build ") {
			build = line
		}
	}
	require.NotEmpty(t, build, "the Dockerfile has a go build line")
	for _, env := range cluster.ShippedBuild.Env {
		assert.Contains(t, strings.Fields(build), env, "the Dockerfile builds with %s", env)
	}
	var flags []string
	for _, f := range cluster.ShippedBuild.Flags {
		if strings.Contains(f, " ") {
			f = `"` + f + `"`
		}
		flags = append(flags, f)
	}
	assert.Contains(t, build, " go build "+strings.Join(flags, " ")+" -o manager .",
		"cluster.ShippedBuild and the Dockerfile's go build line build the same binary")
}

// TestTheBinaryKeepsOnlyTheMethodsItCalls: nothing the shipped build links
// calls methods by name through a template, which would keep every
// exported method of the binary alive (decision 106; the AWS SDK's EC2
// client alone is 600 operations): with the operator's build tags gRPC
// leaves out its request tracing, whose debug pages are templates; the
// operator's own packages import no template package (depguard); and
// make build uses the same tags.
func TestTheBinaryKeepsOnlyTheMethodsItCalls(t *testing.T) {
	cmd := exec.Command("go", "list", "-tags", cluster.BuildTags, "-deps", ".")
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", out)
	deps := strings.Fields(string(out))
	assert.True(t, slices.Contains(deps, "google.golang.org/grpc"), "the GCP clients bring gRPC")
	assert.False(t, slices.Contains(deps, "golang.org/x/net/trace"), "gRPC's request tracing (golang.org/x/net/trace) is left out with -tags %s", cluster.BuildTags)
	assert.Contains(t, string(repoFile(t, "Makefile")), "GO_TAGS ?= "+cluster.BuildTags+"\n", "make build uses the operator's build tags")
}
