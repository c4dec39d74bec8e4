package squidconf

import (
	_ "embed" // the key fetcher ships as a file of its own
)

// LeaseKeyFetcher is the script a VM runs at boot to fetch its lease key
// with its own identity (fetch-lease-key.py: a GCE service account's token
// and Secret Manager, or an instance profile's credentials and SSM
// Parameter Store), so the key is never in metadata or user-data that a
// project viewer or ec2:DescribeInstanceAttribute can read.
//
//go:embed fetch-lease-key.py
var LeaseKeyFetcher string

// LeaseKeySource is where a VM fetches its lease key: what the provider
// stored it in, named for LeaseKeyFetcher.
type LeaseKeySource struct {
	// Cloud is "gcp" or "aws": the fetcher's second argument.
	Cloud string
	// Args are the fetcher's arguments after Cloud.
	Args []string
}

// SecretManagerKey is a lease key in a Secret Manager secret version
// (projects/P/secrets/S/versions/latest), read through api (the Secret
// Manager endpoint, https://secretmanager.googleapis.com).
func SecretManagerKey(version, api string) LeaseKeySource {
	return LeaseKeySource{Cloud: "gcp", Args: []string{version, api}}
}

// ParameterStoreKey is a lease key in an SSM Parameter Store SecureString
// parameter of region, read through api (https://ssm.<region>.amazonaws.com).
func ParameterStoreKey(name, region, api string) LeaseKeySource {
	return LeaseKeySource{Cloud: "aws", Args: []string{name, region, api}}
}

// Command is the command line that fetches the key into out, with the
// fetcher at script.
func (s LeaseKeySource) Command(script, out string) []string {
	return append([]string{"python3", script, out, s.Cloud}, s.Args...)
}
