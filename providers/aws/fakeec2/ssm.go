package fakeec2

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The SSM Parameter Store calls the aws provider makes (PutParameter,
// GetParameter, DeleteParameter, in the JSON 1.1 protocol) and the IMDSv2
// paths a VM's key fetcher reads its instance profile's credentials from,
// served beside EC2 so that a test points every endpoint at one server.
// Every SSM call must carry a valid Signature Version 4 of a key the fake
// knows: the SDK's static test key, or credentials IMDS issued (with their
// session token); GetParameter with decryption is only for the latter, as
// only the instance profile's role may read the keys.

// SDKAccessKey and SDKSecretKey are the static key the aws provider signs
// with under settings.withoutAuthentication.
const (
	SDKAccessKey = "AKIDFAKE"
	SDKSecretKey = "fake-secret"
)

// InstanceRole is the role name IMDS answers for the instance profile.
const InstanceRole = "egress-proxy-vm"

// parameter is one fake SecureString parameter.
type parameter struct {
	value   string
	version int64
	tags    map[string]string
}

// issued are credentials IMDS handed out: secret key and session token.
type issued struct{ secret, token string }

// Parameter is the value of the parameter called name, and whether it
// exists.
func (s *Server) Parameter(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.parameters[name]
	if !ok {
		return "", false
	}
	return p.value, true
}

// Parameters are the names of the parameters that exist, sorted.
func (s *Server) Parameters() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.parameters))
}

// ParameterVersion is the version of the parameter called name (0: none).
func (s *Server) ParameterVersion(name string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.parameters[name]; ok {
		return p.version
	}
	return 0
}

// serveSSM answers one SSM JSON 1.1 call.
func (s *Server) serveSSM(w http.ResponseWriter, r *http.Request, target string) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "ValidationException", err.Error())
		return
	}
	action := strings.TrimPrefix(target, "AmazonSSM.")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[action]++
	role, err := s.verifySigV4Locked(r, body, "ssm")
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "InvalidSignatureException", err.Error())
		return
	}
	if s.down {
		writeJSONError(w, http.StatusServiceUnavailable, "ServiceUnavailable", "The service is unavailable.")
		return
	}
	var in struct {
		Name, Value, Type         string
		Overwrite, WithDecryption bool
		Tags                      []struct{ Key, Value string }
	}
	if err := json.Unmarshal(body, &in); err != nil || in.Name == "" {
		writeJSONError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("a parameter name is required (%v)", err))
		return
	}
	p, exists := s.parameters[in.Name]
	var out any
	switch action {
	case "PutParameter":
		switch {
		case in.Type != "SecureString":
			writeJSONError(w, http.StatusBadRequest, "ValidationException", "the fake keeps SecureString parameters only")
			return
		case exists && !in.Overwrite:
			writeJSONError(w, http.StatusBadRequest, "ParameterAlreadyExists", "The parameter already exists. To overwrite this value, set the overwrite option in the request to true.")
			return
		case in.Overwrite && len(in.Tags) > 0:
			writeJSONError(w, http.StatusBadRequest, "ValidationException", "Invalid request: tags and overwrite can't be used together.")
			return
		}
		if !exists {
			p = &parameter{tags: map[string]string{}}
			s.parameters[in.Name] = p
		}
		for _, t := range in.Tags {
			p.tags[t.Key] = t.Value
		}
		p.value = in.Value
		p.version++
		out = map[string]any{"Version": p.version, "Tier": "Standard"}
	case "GetParameter":
		switch {
		case !exists:
			writeJSONError(w, http.StatusBadRequest, "ParameterNotFound", "")
			return
		case in.WithDecryption && role == "":
			writeJSONError(w, http.StatusBadRequest, "AccessDeniedException", "the fake decrypts for the instance profile's role alone")
			return
		}
		out = map[string]any{"Parameter": map[string]any{"Name": in.Name, "Type": "SecureString", "Value": p.value, "Version": p.version}}
	case "DeleteParameter":
		if !exists {
			writeJSONError(w, http.StatusBadRequest, "ParameterNotFound", "")
			return
		}
		delete(s.parameters, in.Name)
		out = map[string]any{}
	default:
		writeJSONError(w, http.StatusBadRequest, "UnknownOperationException", "fakeec2 does not serve "+target)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(out)
}

// serveIMDS answers IMDSv2: a token for a PUT, and with that token the
// instance profile's role and its credentials.
func (s *Server) serveIMDS(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	const creds = "/latest/meta-data/iam/security-credentials/"
	if r.URL.Path == "/latest/api/token" {
		if r.Method != http.MethodPut || r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
			http.Error(w, "IMDSv2 tokens come from a PUT with a TTL", http.StatusBadRequest)
			return
		}
		token := randomHex(16)
		s.imdsTokens[token] = true
		_, _ = io.WriteString(w, token)
		return
	}
	if !s.imdsTokens[r.Header.Get("X-aws-ec2-metadata-token")] {
		http.Error(w, "Unauthorized", http.StatusUnauthorized) // IMDSv1 is off on the operator's instances
		return
	}
	switch r.URL.Path {
	case creds:
		_, _ = io.WriteString(w, InstanceRole)
	case creds + InstanceRole:
		id, cred := "ASIA"+strings.ToUpper(randomHex(8)), issued{secret: randomHex(20), token: randomHex(32)}
		s.issued[id] = cred
		w.Header().Set("Content-Type", "text/plain")
		_ = json.NewEncoder(w).Encode(map[string]string{"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": id,
			"SecretAccessKey": cred.secret, "Token": cred.token, "Expiration": time.Now().Add(6 * time.Hour).UTC().Format(time.RFC3339)})
	default:
		http.NotFound(w, r)
	}
}

// verifySigV4Locked checks r's Signature Version 4 for service, over the
// headers it names, with the key it names: the SDK's static key (role "")
// or credentials IMDS issued (role InstanceRole, their session token
// required and signed).
func (s *Server) verifySigV4Locked(r *http.Request, body []byte, service string) (string, error) {
	auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ")
	if !ok {
		return "", fmt.Errorf("not signed with AWS4-HMAC-SHA256")
	}
	fields := map[string]string{}
	for _, part := range strings.Split(auth, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		fields[k] = v
	}
	scope := strings.SplitN(fields["Credential"], "/", 2)
	if len(scope) != 2 || !strings.HasSuffix(scope[1], "/"+service+"/aws4_request") {
		return "", fmt.Errorf("credential scope %q is not for %s", fields["Credential"], service)
	}
	id, day, region := scope[0], strings.Split(scope[1], "/")[0], strings.Split(scope[1], "/")[1]
	var secret, role string
	switch cred, ok := s.issued[id]; {
	case id == SDKAccessKey:
		secret = SDKSecretKey
	case ok:
		if r.Header.Get("X-Amz-Security-Token") != cred.token {
			return "", fmt.Errorf("the security token does not belong to %s", id)
		}
		secret, role = cred.secret, InstanceRole
	default:
		return "", fmt.Errorf("the access key %s is not known", id)
	}
	signed := strings.Split(fields["SignedHeaders"], ";")
	for _, must := range []string{"host", "x-amz-date"} {
		if !slices.Contains(signed, must) {
			return "", fmt.Errorf("%s is not signed", must)
		}
	}
	if role != "" && !slices.Contains(signed, "x-amz-security-token") {
		return "", fmt.Errorf("x-amz-security-token is not signed")
	}
	var canonical strings.Builder
	fmt.Fprintf(&canonical, "%s\n%s\n%s\n", r.Method, orSlash(r.URL.EscapedPath()), r.URL.RawQuery)
	for _, h := range signed {
		value := r.Header.Get(h)
		if h == "host" {
			value = r.Host
		}
		fmt.Fprintf(&canonical, "%s:%s\n", h, strings.Join(strings.Fields(value), " "))
	}
	payload := sha256.Sum256(body)
	fmt.Fprintf(&canonical, "\n%s\n%s", fields["SignedHeaders"], hex.EncodeToString(payload[:]))
	request := sha256.Sum256([]byte(canonical.String()))
	toSign := strings.Join([]string{"AWS4-HMAC-SHA256", r.Header.Get("X-Amz-Date"), scope[1], hex.EncodeToString(request[:])}, "\n")
	key := []byte("AWS4" + secret)
	for _, part := range []string{day, region, service, "aws4_request"} {
		key = hmacSHA256(key, part)
	}
	if !hmac.Equal([]byte(hex.EncodeToString(hmacSHA256(key, toSign))), []byte(fields["Signature"])) {
		return "", fmt.Errorf("the request signature we calculated does not match the signature you provided")
	}
	return role, nil
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func orSlash(path string) string {
	if path == "" {
		return "/"
	}
	return path
}

func randomHex(n int) string {
	raw := make([]byte, n)
	_, _ = rand.Read(raw)
	return hex.EncodeToString(raw)
}

// writeJSONError writes an error in the JSON 1.1 protocol's shape, which
// the SDK decodes into a smithy.APIError with code.
func writeJSONError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "message": message})
}
