package fakecompute

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// The Secret Manager calls the gcp provider makes (secrets create, delete,
// addVersion, versions access) and the metadata server's token endpoint a
// VM's key fetcher calls, served beside Compute so that a test points
// every endpoint at one server. Only a token the metadata endpoint issued
// may access a version, as only the VM's own identity can.

// secret is one fake secret: its labels and its versions' payloads, oldest
// first.
type secret struct {
	labels   map[string]string
	versions [][]byte
}

func (s *Server) registerSecrets(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/projects/{project}/secrets", s.createSecret)
	mux.HandleFunc("POST /v1/projects/{project}/secrets/{call}", s.addSecretVersion)
	mux.HandleFunc("DELETE /v1/projects/{project}/secrets/{secret}", s.deleteSecret)
	mux.HandleFunc("GET /v1/projects/{project}/secrets/{secret}/versions/{call}", s.accessSecretVersion)
	mux.HandleFunc("GET /computeMetadata/v1/instance/service-accounts/default/token", s.metadataToken)
}

// Secret is the latest version of the secret called name
// (projects/P/secrets/S), and whether there is one.
func (s *Server) Secret(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sec, ok := s.secrets[name]
	if !ok || len(sec.versions) == 0 {
		return "", false
	}
	return string(sec.versions[len(sec.versions)-1]), true
}

// Secrets are the names of the secrets that exist, sorted.
func (s *Server) Secrets() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.secrets))
}

// SecretVersions counts the versions of the secret called name.
func (s *Server) SecretVersions(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sec, ok := s.secrets[name]; ok {
		return len(sec.versions)
	}
	return 0
}

func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) {
	var res secretmanagerpb.Secret
	if !readProto(w, r, &res) {
		return
	}
	id := r.URL.Query().Get("secretId")
	if id == "" || strings.ContainsAny(id, "/:") {
		writeError(w, http.StatusBadRequest, "badRequest", fmt.Sprintf("Secret ID %q is invalid", id))
		return
	}
	name := "projects/" + r.PathValue("project") + "/secrets/" + id
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests["secrets.create"]++
	if _, ok := s.secrets[name]; ok {
		writeError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("Secret [%s] already exists.", name))
		return
	}
	s.secrets[name] = &secret{labels: res.GetLabels()}
	res.Name = name
	writeProto(w, &res)
}

func (s *Server) addSecretVersion(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutSuffix(r.PathValue("call"), ":addVersion")
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", "fakecompute serves only :addVersion on a secret")
		return
	}
	var req secretmanagerpb.AddSecretVersionRequest
	if !readProto(w, r, &req) {
		return
	}
	name := "projects/" + r.PathValue("project") + "/secrets/" + id
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests["secrets.addVersion"]++
	sec, found := s.secrets[name]
	if !found {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("Secret [%s] not found.", name))
		return
	}
	sec.versions = append(sec.versions, req.GetPayload().GetData())
	writeProto(w, &secretmanagerpb.SecretVersion{Name: fmt.Sprintf("%s/versions/%d", name, len(sec.versions)),
		State: secretmanagerpb.SecretVersion_ENABLED})
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	name := "projects/" + r.PathValue("project") + "/secrets/" + r.PathValue("secret")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests["secrets.delete"]++
	if _, ok := s.secrets[name]; !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("Secret [%s] not found.", name))
		return
	}
	delete(s.secrets, name)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, "{}")
}

// accessSecretVersion serves "latest:access" (the only version the fetcher
// and the provider read) to the operator (no token: its client is
// unauthenticated against the fake) and to tokens the metadata server
// issued; any other bearer is refused, as IAM would refuse a stranger.
func (s *Server) accessSecretVersion(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("call") != "latest:access" {
		writeError(w, http.StatusNotFound, "notFound", "fakecompute serves only versions/latest:access")
		return
	}
	name := "projects/" + r.PathValue("project") + "/secrets/" + r.PathValue("secret")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests["secrets.access"]++
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && !s.vmTokens[bearer] {
		writeError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("Permission 'secretmanager.versions.access' denied for resource '%s/versions/latest'", name))
		return
	}
	sec, ok := s.secrets[name]
	if !ok || len(sec.versions) == 0 {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("Secret Version [%s/versions/latest] not found.", name))
		return
	}
	writeProto(w, &secretmanagerpb.AccessSecretVersionResponse{
		Name:    fmt.Sprintf("%s/versions/%d", name, len(sec.versions)),
		Payload: &secretmanagerpb.SecretPayload{Data: sec.versions[len(sec.versions)-1]},
	})
}

// metadataToken is the metadata server's token for the VM's service
// account: only with the Metadata-Flavor header, as GCE's.
func (s *Server) metadataToken(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	raw := make([]byte, 16)
	_, _ = rand.Read(raw)
	token := "ya29.fake-" + hex.EncodeToString(raw)
	s.mu.Lock()
	s.vmTokens[token] = true
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"access_token":%q,"expires_in":3599,"token_type":"Bearer"}`, token)
}

// readProto decodes a JSON request body into m, answering 400 when it
// cannot.
func readProto(w http.ResponseWriter, r *http.Request, m proto.Message) bool {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = protojson.Unmarshal(body, m)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "badRequest", err.Error())
		return false
	}
	return true
}
