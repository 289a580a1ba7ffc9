package amqp10

// Type constructors (format codes) of the AMQP 1.0 type system.
const (
	codeDescribed  = 0x00
	codeNull       = 0x40
	codeTrue       = 0x41
	codeFalse      = 0x42
	codeUint0      = 0x43
	codeUlong0     = 0x44
	codeList0      = 0x45
	codeUbyte      = 0x50
	codeByte       = 0x51
	codeSmallUint  = 0x52
	codeSmallUlong = 0x53
	codeSmallInt   = 0x54
	codeSmallLong  = 0x55
	codeBoolean    = 0x56
	codeUshort     = 0x60
	codeShort      = 0x61
	codeUint       = 0x70
	codeInt        = 0x71
	codeFloat      = 0x72
	codeChar       = 0x73
	codeDecimal32  = 0x74
	codeUlong      = 0x80
	codeLong       = 0x81
	codeDouble     = 0x82
	codeTimestamp  = 0x83
	codeDecimal64  = 0x84
	codeDecimal128 = 0x94
	codeUUID       = 0x98
	codeVbin8      = 0xa0
	codeStr8       = 0xa1
	codeSym8       = 0xa3
	codeVbin32     = 0xb0
	codeStr32      = 0xb1
	codeSym32      = 0xb3
	codeList8      = 0xc0
	codeMap8       = 0xc1
	codeList32     = 0xd0
	codeMap32      = 0xd1
	codeArray8     = 0xe0
	codeArray32    = 0xf0
)

// Section descriptor codes (part 3.2 of the specification).
const (
	DescriptorHeader                = 0x70
	DescriptorDeliveryAnnotations   = 0x71
	DescriptorMessageAnnotations    = 0x72
	DescriptorProperties            = 0x73
	DescriptorApplicationProperties = 0x74
	DescriptorData                  = 0x75
	DescriptorAmqpSequence          = 0x76
	DescriptorAmqpValue             = 0x77
	DescriptorFooter                = 0x78
)

// sectionSymbols are the symbolic descriptors of the sections, accepted like the codes.
var sectionSymbols = map[Symbol]uint64{
	"amqp:header:list":                DescriptorHeader,
	"amqp:delivery-annotations:map":   DescriptorDeliveryAnnotations,
	"amqp:message-annotations:map":    DescriptorMessageAnnotations,
	"amqp:properties:list":            DescriptorProperties,
	"amqp:application-properties:map": DescriptorApplicationProperties,
	"amqp:data:binary":                DescriptorData,
	"amqp:amqp-sequence:list":         DescriptorAmqpSequence,
	"amqp:amqp-value:*":               DescriptorAmqpValue,
	"amqp:footer:map":                 DescriptorFooter,
}
